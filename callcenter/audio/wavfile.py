"""Reading caller WAV files into the call format (8 kHz mono 16-bit), resampling once at the edge."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import soxr

from callcenter.errors import CallcenterError
from callcenter.audio.frames import SAMPLE_RATE, SAMPLE_WIDTH


class AudioFileError(CallcenterError, ValueError):
    """A WAV file that cannot be used, with the reason."""


def read_wav(path: str | Path, rate: int = SAMPLE_RATE) -> bytes:
    """Return the file as 16-bit mono PCM at `rate`, mixing down and resampling as needed."""
    path = Path(path)
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, src_rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except FileNotFoundError:
        raise AudioFileError(f"{path}: no such file") from None
    except (wave.Error, EOFError) as exc:
        raise AudioFileError(f"{path}: not a PCM WAV file ({exc})") from None
    if width == 2 and channels == 1 and src_rate == rate:
        return raw[: len(raw) & ~1]
    if width not in (1, 2, 4):
        raise AudioFileError(f"{path}: {8 * width}-bit samples are not supported (use 8, 16 or 32-bit PCM)")
    if width == 1:
        x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    else:
        x = np.frombuffer(raw, dtype="<i4").astype(np.float32) / 2147483648.0
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1)
    if src_rate != rate:
        x = soxr.resample(x, src_rate, rate, quality="HQ")
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def write_wav(path: str | Path, pcm: bytes, rate: int = SAMPLE_RATE, channels: int = 1) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(SAMPLE_WIDTH)
        w.setframerate(rate)
        w.writeframes(pcm)
