import warnings

import numpy as np
import pytest

from callcenter.audio.g711 import ulaw_decode, ulaw_encode, ulaw_roundtrip


def test_ulaw_known_codes():
    pcm = np.array([0, 1, -1, 32767, -32768, 1000, -1000], dtype="<i2").tobytes()
    assert ulaw_encode(pcm) == bytes([0xFF, 0xFF, 0x7E, 0x80, 0x00, 0xCE, 0x4E])


def test_ulaw_decode_table_edges():
    assert np.frombuffer(ulaw_decode(bytes([0xFF, 0x80, 0x00, 0x7F])), "<i2").tolist() == [0, 32124, -32124, 0]


def test_roundtrip_is_close_and_idempotent():
    x = (np.sin(np.linspace(0, 50, 8000)) * 20000).astype("<i2")
    once = ulaw_roundtrip(x.tobytes())
    err = np.abs(np.frombuffer(once, "<i2").astype(int) - x.astype(int))
    assert err.max() <= 20000 / 32  # within one µ-law step at that level
    assert ulaw_roundtrip(once) == once


def test_bit_exact_with_the_reference_coder():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")  # the reference G.711 coder, in CPython up to 3.12
    x = np.arange(-32768, 32768, dtype="<i2").tobytes()
    assert ulaw_encode(x) == audioop.lin2ulaw(x, 2)
    assert ulaw_decode(bytes(range(256))) == audioop.ulaw2lin(bytes(range(256)), 2)
