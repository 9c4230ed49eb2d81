"""In-band DTMF: keypad tones in the caller's audio (a keypad held to a microphone, gateways and
WebRTC legs that send no RFC 4733 events)."""

import numpy as np
import pytest

from callcenter.audio import g711
from callcenter.audio.frames import float_to_pcm, frames_from_pcm
from callcenter.audio.stage import Moment
from callcenter.call.caller import speak
from callcenter.hearing.dtmf import KEYS, InbandDtmf, dtmf_tone

ALL_KEYS = "".join(KEYS)


def detect(x: np.ndarray) -> str:
    d = InbandDtmf()
    return "".join(k for f in frames_from_pcm(float_to_pcm(x)) for k in d.process(f, Moment()))


def line(x: np.ndarray, noise_dbfs: float = -45.0, seed: int = 0) -> np.ndarray:
    """White noise under it and a G.711 µ-law trip, as a phone line delivers it."""
    x = x + np.random.default_rng(seed).standard_normal(len(x)) * 10 ** (noise_dbfs / 20)
    return np.frombuffer(g711.ulaw_roundtrip(float_to_pcm(x)), "<i2") / 32768


@pytest.fixture(scope="module")
def speech():
    return speak("Hello, my account number is four seven two, and I need help.", "flite:kal") * 0.5


@pytest.mark.parametrize("level_dbfs", [-7.0, -27.0])  # about 0 dBm0 and -20 dBm0 for the pair
def test_all_sixteen_keys_between_speech(speech, level_dbfs):
    parts = [speech]
    for key in ALL_KEYS:
        parts += [dtmf_tone(key, 0.07, level_dbfs), np.zeros(400)]  # 70 ms tones, 50 ms gaps
    parts.append(speech)
    assert detect(line(np.concatenate(parts))) == ALL_KEYS


def test_a_held_key_counts_once_and_a_repeat_twice():
    gap = np.zeros(480)
    assert detect(line(np.concatenate([dtmf_tone("5", 0.6), gap]))) == "5"
    assert detect(line(np.concatenate([dtmf_tone("5", 0.08), gap, dtmf_tone("5", 0.08), gap]))) == "55"


def test_too_short_or_too_quiet_or_twisted_is_not_a_key():
    assert detect(line(dtmf_tone("1", 0.02))) == ""
    assert detect(line(dtmf_tone("1", 0.1, level_dbfs=-60), noise_dbfs=-90)) == ""
    t = np.arange(800) / 8000
    twisted = 0.3 * np.sin(2 * np.pi * 697 * t) + 0.02 * np.sin(2 * np.pi * 1209 * t)  # 23 dB twist
    assert detect(line(twisted)) == ""


def test_no_false_keys_in_speech(speech):
    voices = [speak("Please transfer me to the billing department, the number is five five five.", v)
              for v in ("joe", "awb", "slt", "flite:rms", "flite:slt")]
    assert detect(line(np.concatenate([speech, *voices]))) == ""


def test_no_false_keys_in_ten_minutes_of_caller_speech():
    """Talk-off on the whole evaluation set: 240 utterances, about 13 minutes, clean and noisy."""
    from callcenter.lab.bench.hearing import EVAL_DIR, _samples, load_manifest

    if not (EVAL_DIR / "manifest.jsonl").exists():
        pytest.skip("needs ../shared/eval")
    items = load_manifest()
    x = np.concatenate([_samples(EVAL_DIR / e["path"]) for e in items])
    assert len(x) / 8000 > 600
    assert detect(x) == ""
