import wave

import numpy as np
import pytest

from callcenter.audio.frames import FRAME_BYTES, FRAME_SAMPLES, SAMPLE_RATE, AudioFrame, FrameChunker, frames_from_pcm
from callcenter.audio.wavfile import AudioFileError, read_wav, write_wav


def test_frame_format_constants():
    assert SAMPLE_RATE == 8000 and FRAME_SAMPLES == 160 and FRAME_BYTES == 320


def test_frame_rejects_wrong_size():
    with pytest.raises(ValueError):
        AudioFrame(b"\x00" * 100)


def test_frames_from_pcm_pads_last_frame():
    frames = list(frames_from_pcm(b"\x01\x00" * 200))
    assert len(frames) == 2
    assert frames[1].pcm[: 40 * 2] == b"\x01\x00" * 40 and frames[1].pcm[80:] == bytes(240)


def test_chunker_keeps_remainder():
    c = FrameChunker()
    assert c.push(b"\x00" * 300) == []
    assert len(c.push(b"\x00" * 400)) == 2
    assert len(c.flush()) == 1


def test_read_wav_resamples_and_mixes_down(tmp_path):
    t = np.arange(16000) / 16000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    stereo = np.stack([tone, tone], axis=1).tobytes()
    path = tmp_path / "x.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(stereo)
    pcm = read_wav(path)
    assert abs(len(pcm) // 2 - 8000) <= 2  # one second at 8 kHz
    x = np.frombuffer(pcm, "<i2") / 32768
    assert 0.3 < np.sqrt(np.mean(x[100:-100] ** 2)) < 0.4  # the 0.5 amplitude sine survived


def test_read_wav_errors_are_clear(tmp_path):
    with pytest.raises(AudioFileError, match="no such file"):
        read_wav(tmp_path / "missing.wav")
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav at all")
    with pytest.raises(AudioFileError, match="not a WAV file"):
        read_wav(bad)


def test_write_then_read_roundtrip(tmp_path):
    pcm = (np.arange(800, dtype="<i2") * 7).tobytes()
    write_wav(tmp_path / "r.wav", pcm)
    assert read_wav(tmp_path / "r.wav") == pcm
