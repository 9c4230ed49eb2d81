"""The agent's voice: text-to-speech backends that stream 20 ms frames."""
