"""Streaming noise gate: gates noise, keeps speech, no clicks at frame joins."""

from pathlib import Path

import numpy as np
import pytest

from callcenter.audio.frames import SAMPLE_RATE, frames_from_pcm
from callcenter.audio.stage import Moment
from callcenter.hearing.denoise import Denoiser

rng = np.random.default_rng(0)


def _run(pcm: bytes) -> tuple[np.ndarray, Denoiser]:
    d = Denoiser()
    out = b"".join(d.process(f, Moment()).pcm for f in frames_from_pcm(pcm))
    return np.frombuffer(out, "<i2").astype(float)[int(d.LATENCY_MS * SAMPLE_RATE / 1000):], d


def _pcm(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def _speechlike(seconds: float) -> np.ndarray:
    """Voiced bursts (harmonics of a gliding pitch) with pauses, at about -20 dBFS."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 20))
    envelope = (np.sin(2 * np.pi * 2.0 * t) > 0.2).astype(float)
    return 0.05 * voiced * np.convolve(envelope, np.hanning(200) / 100, mode="same")


def test_clean_audio_passes_unchanged_but_for_the_delay():
    x = _speechlike(2.0)
    y, _ = _run(_pcm(x))
    n = len(y)
    ref = np.round(np.clip(x, -1, 1) * 32767)[:n]
    snr = 10 * np.log10(np.sum(ref[4000:] ** 2) / np.sum((y[4000:n] - ref[4000:]) ** 2))
    assert snr > 20


def test_white_noise_is_gated_and_speech_kept():
    speech = np.concatenate([np.zeros(SAMPLE_RATE), _speechlike(2.0), np.zeros(SAMPLE_RATE)])
    noise = rng.standard_normal(len(speech)) * 0.01
    y, _ = _run(_pcm(speech + noise))
    x = speech + noise
    noise_only = slice(len(y) - 6000, len(y) - 1000)
    attenuation = 10 * np.log10(np.mean((x[noise_only] * 32767) ** 2) / np.mean(y[noise_only] ** 2 + 1e-9))
    assert attenuation > 20
    voiced = slice(SAMPLE_RATE + 2000, 3 * SAMPLE_RATE - 2000)
    kept = np.mean(y[voiced] ** 2) / np.mean((speech[voiced] * 32767) ** 2)
    assert kept > 0.5


def test_no_clicks_at_frame_joins():
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    x = 0.2 * np.sin(2 * np.pi * 440 * t)
    y, _ = _run(_pcm(x))
    steady = y[4000:-1000]
    assert np.max(np.abs(np.diff(steady))) < 1.1 * np.max(np.abs(np.diff(x * 32767)))


@pytest.mark.skipif(not Path("../shared/eval/manifest.jsonl").exists(), reason="needs ../shared/eval")
def test_eval_white_noise_file_is_cleaned():
    from callcenter.audio.wavfile import read_wav

    noisy = read_wav("../shared/eval/white10/u000.wav")
    y, _ = _run(noisy)
    x = np.frombuffer(noisy, "<i2").astype(float)
    tail = slice(len(y) - 3000, len(y) - 400)
    assert 10 * np.log10(np.mean(x[tail] ** 2) / np.mean(y[tail] ** 2 + 1e-9)) > 20
