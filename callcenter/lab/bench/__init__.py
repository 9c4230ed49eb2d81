"""Bench commands: `callcenter bench call|soak|webrtc|tts|stt|nlu`."""
