"""Audio formats shared by every stage: 8 kHz, 16-bit mono, 20 ms frames."""

from callcenter.audio.frames import (
    FRAME_BYTES,
    FRAME_MS,
    FRAME_SAMPLES,
    SAMPLE_RATE,
    SAMPLE_WIDTH,
    AudioFrame,
    frames_from_pcm,
    silence,
)

__all__ = [
    "FRAME_BYTES",
    "FRAME_MS",
    "FRAME_SAMPLES",
    "SAMPLE_RATE",
    "SAMPLE_WIDTH",
    "AudioFrame",
    "frames_from_pcm",
    "silence",
]
