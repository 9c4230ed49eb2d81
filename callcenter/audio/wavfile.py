"""Reading caller WAV files into the call format (8 kHz mono 16-bit), resampling once at the edge."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from callcenter.audio.frames import SAMPLE_RATE, SAMPLE_WIDTH
from callcenter.errors import CallcenterError


class AudioFileError(CallcenterError, ValueError):
    """A WAV file that cannot be used, with the reason."""


# WAVE format tags (RIFF `fmt ` chunk): what read_wav decodes
WAVE_PCM, WAVE_FLOAT, WAVE_ALAW, WAVE_ULAW, WAVE_EXTENSIBLE = 1, 3, 6, 7, 0xFFFE
MAX_WAV_BYTES = 2**31  # a larger "WAV" is not a caller's recording


def _chunks(data: bytes, path: Path):
    if len(data) < 12 or data[:4] not in (b"RIFF", b"RF64") or data[8:12] != b"WAVE":
        start = data[:16].decode("latin-1").encode("unicode_escape").decode()
        raise AudioFileError(f"{path}: not a WAV file (it starts with {start!r})" if data else f"{path}: empty file")
    at = 12
    while at + 8 <= len(data):
        cid, size = data[at:at + 4], int.from_bytes(data[at + 4:at + 8], "little")
        yield cid, data[at + 8:at + 8 + size]
        at += 8 + size + (size & 1)


def decode_wav(data: bytes, path: Path = Path("<wav>"), pcm16_at: int | None = None) -> tuple[np.ndarray | bytes, int]:
    """Float samples in [-1, 1] (mixed down to mono) and the rate of a WAV file's bytes: PCM of 8,
    16, 24 or 32 bits, 32/64-bit float, A-law or µ-law, plain or WAVE_FORMAT_EXTENSIBLE. A file
    that is already 16-bit mono PCM at `pcm16_at` Hz comes back as its bytes, untouched."""
    fmt = raw = None
    for cid, body in _chunks(data, path):
        if cid == b"fmt " and fmt is None:
            fmt = body
        elif cid == b"data" and raw is None:
            raw = body
    if fmt is None or len(fmt) < 16:
        raise AudioFileError(f"{path}: WAV file without a format chunk")
    tag, channels, rate = int.from_bytes(fmt[0:2], "little"), int.from_bytes(fmt[2:4], "little"), \
        int.from_bytes(fmt[4:8], "little")
    bits = int.from_bytes(fmt[14:16], "little")
    if tag == WAVE_EXTENSIBLE and len(fmt) >= 26:
        tag = int.from_bytes(fmt[24:26], "little")  # the sub-format GUID starts with the plain tag
    if channels < 1 or not 1000 <= rate <= 384000:
        raise AudioFileError(f"{path}: implausible WAV header ({channels} channels at {rate} Hz)")
    if not raw:
        raise AudioFileError(f"{path}: the file holds no audio (a header only)")
    if tag == WAVE_PCM and bits == 16 and channels == 1 and rate == pcm16_at:
        return raw[: len(raw) & ~1], rate
    if tag == WAVE_PCM and bits in (8, 16, 24, 32):
        width = bits // 8
        raw = raw[: len(raw) - len(raw) % (width * channels)]
        if width == 1:
            x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
        elif width == 2:
            x = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
        elif width == 3:
            b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
            v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
            x = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
        else:
            x = np.frombuffer(raw, dtype="<i4").astype(np.float32) / 2147483648.0
    elif tag == WAVE_FLOAT and bits in (32, 64):
        dtype = "<f4" if bits == 32 else "<f8"
        raw = raw[: len(raw) - len(raw) % (bits // 8 * channels)]
        x = np.nan_to_num(np.frombuffer(raw, dtype=dtype).astype(np.float32))
    elif tag in (WAVE_ALAW, WAVE_ULAW) and bits == 8:
        from callcenter.audio.g711 import alaw_decode, ulaw_decode

        raw = raw[: len(raw) - len(raw) % channels]
        pcm = (alaw_decode if tag == WAVE_ALAW else ulaw_decode)(raw)
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    else:
        raise AudioFileError(f"{path}: WAV encoding {tag:#x} with {bits}-bit samples is not supported "
                             "(PCM 8/16/24/32-bit, float 32/64-bit, A-law and µ-law are)")
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1)
    return np.clip(x, -1.0, 1.0), rate


def read_wav(path: str | Path, rate: int = SAMPLE_RATE) -> bytes:
    """Return the file as 16-bit mono PCM at `rate`, mixing down and resampling as needed."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_WAV_BYTES:
            raise AudioFileError(f"{path}: larger than {MAX_WAV_BYTES >> 30} GB")
        data = path.read_bytes()
    except FileNotFoundError:
        raise AudioFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise AudioFileError(f"{path}: a directory, not a WAV file") from None
    except OSError as exc:
        raise AudioFileError(f"{path}: cannot read ({exc.strerror})") from None
    x, src_rate = decode_wav(data, path, pcm16_at=rate)
    if isinstance(x, bytes):
        return x
    if src_rate != rate:
        import soxr

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
