"""The unit of audio that flows through a call: one 20 ms frame of 8 kHz 16-bit mono PCM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

SAMPLE_RATE = 8000
SAMPLE_WIDTH = 2  # bytes per sample, signed 16-bit little endian
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 160
FRAME_BYTES = FRAME_SAMPLES * SAMPLE_WIDTH  # 320


@dataclass(frozen=True, slots=True)
class AudioFrame:
    """20 ms of 8 kHz signed 16-bit mono PCM."""

    pcm: bytes

    def __post_init__(self) -> None:
        if len(self.pcm) != FRAME_BYTES:
            raise ValueError(f"an AudioFrame holds {FRAME_BYTES} bytes, got {len(self.pcm)}")

    @property
    def samples(self) -> np.ndarray:
        return np.frombuffer(self.pcm, dtype="<i2")

    def as_float(self) -> np.ndarray:
        return self.samples.astype(np.float32) / 32768.0

    def rms_dbfs(self) -> float:
        x = self.as_float()
        power = float(np.mean(x * x))
        return 10.0 * np.log10(power) if power > 1e-12 else -120.0


_SILENCE = AudioFrame(bytes(FRAME_BYTES))


def silence() -> AudioFrame:
    return _SILENCE


def pcm_to_float(pcm: bytes, dtype=np.float64) -> np.ndarray:
    """16-bit little-endian PCM to float samples in [-1, 1): the inverse of `float_to_pcm`."""
    return np.frombuffer(pcm, dtype="<i2").astype(dtype) / 32768.0


def float_to_pcm(x: np.ndarray) -> bytes:
    """Float samples in [-1, 1] to 16-bit little-endian PCM, clipping overs."""
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def frames_from_pcm(pcm: bytes, pad: bool = True) -> Iterator[AudioFrame]:
    """Cut PCM into 20 ms frames; the last partial frame is zero-padded (or dropped)."""
    for start in range(0, len(pcm), FRAME_BYTES):
        chunk = pcm[start : start + FRAME_BYTES]
        if len(chunk) < FRAME_BYTES:
            if not pad or not chunk:
                return
            chunk = chunk + bytes(FRAME_BYTES - len(chunk))
        yield AudioFrame(chunk)


class FrameChunker:
    """Collects PCM of any length and hands out whole 20 ms frames as they fill."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def push(self, pcm: bytes) -> list[AudioFrame]:
        self._buf += pcm
        n = len(self._buf) // FRAME_BYTES
        out = [AudioFrame(bytes(self._buf[i * FRAME_BYTES : (i + 1) * FRAME_BYTES])) for i in range(n)]
        del self._buf[: n * FRAME_BYTES]
        return out

    def flush(self) -> list[AudioFrame]:
        if not self._buf:
            return []
        pcm = bytes(self._buf) + bytes(FRAME_BYTES - len(self._buf))
        self._buf.clear()
        return [AudioFrame(pcm)]

    def clear(self) -> None:
        self._buf.clear()
