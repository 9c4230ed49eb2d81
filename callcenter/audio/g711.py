"""G.711 µ-law (PCMU), as on the phone line: used to hear offline what a caller's audio becomes
after one trip over an RTP leg (pjsua2 does the live encoding)."""

from __future__ import annotations

import numpy as np

ULAW_BIAS = 0x84
ULAW_CLIP = 8159  # on the 14-bit magnitude, as in the reference (Sun) coder pjmedia uses
_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])


def ulaw_encode(pcm: bytes) -> bytes:
    x = np.frombuffer(pcm, dtype="<i2").astype(np.int32) >> 2
    mask = np.where(x < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(x), ULAW_CLIP) + (ULAW_BIAS >> 2)
    seg = np.searchsorted(_SEG_END, mag)  # first segment whose end is >= mag
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (np.minimum(seg, 7) + 1)) & 0x0F))
    return ((code ^ mask) & 0xFF).astype(np.uint8).tobytes()


def ulaw_decode(data: bytes) -> bytes:
    u = ~np.frombuffer(data, dtype=np.uint8).astype(np.int32) & 0xFF
    sign = u & 0x80
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    mag = (((mantissa << 3) + ULAW_BIAS) << exponent) - ULAW_BIAS
    return np.where(sign != 0, -mag, mag).astype("<i2").tobytes()


_ROUNDTRIP: np.ndarray | None = None


def ulaw_roundtrip(pcm: bytes) -> bytes:
    """What `pcm` sounds like after one µ-law encode and decode (a table of all 65,536 samples,
    built once: a frame costs one lookup, not the coder's dozen array passes)."""
    global _ROUNDTRIP
    if _ROUNDTRIP is None:
        every = np.arange(-32768, 32768, dtype=np.int32).astype("<i2")
        table = np.frombuffer(ulaw_decode(ulaw_encode(every.tobytes())), dtype="<i2")
        _ROUNDTRIP = np.roll(table, -32768)  # indexed by the sample's bits read as unsigned
    return _ROUNDTRIP[np.frombuffer(pcm, dtype="<u2")].tobytes()


def alaw_decode(data: bytes) -> bytes:
    """G.711 A-law bytes → 16-bit PCM (ITU-T G.711, as in the reference coder)."""
    a = np.frombuffer(data, dtype=np.uint8).astype(np.int32) ^ 0x55
    sign = a & 0x80
    exponent = (a >> 4) & 0x07
    mantissa = a & 0x0F
    mag = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(sign != 0, mag, -mag).astype("<i2").tobytes()
