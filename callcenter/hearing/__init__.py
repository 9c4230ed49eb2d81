"""Hearing the caller: voice activity, turn endpointing, speech-to-text."""
