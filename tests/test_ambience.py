"""Phone-line ambience: levels as configured, ducked under the voice, off when clean."""

import numpy as np
import pytest

from callcenter.audio.frames import FRAME_BYTES, FRAME_SAMPLES, SAMPLE_RATE, AudioFrame
from callcenter.audio.stage import Moment
from callcenter.voice.ambience import Ambience
from callcenter.voice.settings import AmbienceSettings, ambience_settings

SILENCE = bytes(FRAME_BYTES)


def _db(x: np.ndarray) -> float:
    return 20 * np.log10(np.sqrt(np.mean(x.astype(np.float64) ** 2)) / 32768 + 1e-12)


def _run(amb: Ambience, pcm: bytes) -> np.ndarray:
    out = b"".join(amb.process(AudioFrame(pcm[i:i + FRAME_BYTES]), Moment()).pcm
                    for i in range(0, len(pcm), FRAME_BYTES))
    return np.frombuffer(out, dtype="<i2")


def _tone(seconds: float, hz: float = 440.0, dbfs: float = -20.0) -> bytes:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (np.sin(2 * np.pi * hz * t) * 10 ** (dbfs / 20) * np.sqrt(2) * 32767).astype("<i2").tobytes()


def test_clean_is_a_pass_through():
    amb = Ambience(ambience_settings("clean"))
    assert not amb.enabled
    pcm = _tone(0.1)
    assert amb.process(AudioFrame(pcm[:FRAME_BYTES]), Moment()).pcm == pcm[:FRAME_BYTES]
    assert not Ambience(AmbienceSettings(preset="callcenter", enabled=False)).enabled


@pytest.mark.parametrize("preset", ["office", "callcenter", "mobile"])
def test_presets_fill_silence_quietly(preset):
    out = _run(Ambience(ambience_settings(preset), seed=3), SILENCE * 150)
    assert -75 < _db(out) < -40          # audible as a line, far below speech


def test_hiss_level_follows_the_setting():
    quiet = _run(Ambience(AmbienceSettings(hiss_db=-60.0), seed=1), SILENCE * 100)
    loud = _run(Ambience(AmbienceSettings(hiss_db=-40.0), seed=1), SILENCE * 100)
    assert _db(quiet) == pytest.approx(-60, abs=1.5)
    assert _db(loud) - _db(quiet) == pytest.approx(20, abs=1.5)


def test_bed_ducks_under_the_voice():
    settings = AmbienceSettings(bed="callcenter", bed_db=-35.0, duck_db=15.0)
    amb = Ambience(settings, seed=2)
    bed_alone = _run(amb, SILENCE * 100)
    speech = _tone(2.0, dbfs=-20.0)
    mixed = _run(Ambience(settings, seed=2), SILENCE * 100 + speech)[100 * FRAME_SAMPLES + 2000:]
    voice = np.frombuffer(speech, dtype="<i2")[2000:]
    residue = mixed.astype(np.float64) - voice
    assert _db(residue) < _db(bed_alone) - 10   # the bed drops by about duck_db under speech


def test_band_limit_removes_low_rumble():
    amb = Ambience(AmbienceSettings(band_limit=True))
    out = _run(amb, _tone(1.0, hz=80.0))
    assert _db(out[2000:]) < -20 - 20


def test_mobile_adds_mains_hum_harmonics():
    out = _run(Ambience(AmbienceSettings(hum_db=-40.0, hum_hz=60)), SILENCE * 50).astype(np.float64)
    spectrum = np.abs(np.fft.rfft(out))
    freqs = np.fft.rfftfreq(len(out), 1 / SAMPLE_RATE)
    assert abs(freqs[np.argmax(spectrum)] - 60) < 2


def test_flow_ambience_accepts_a_preset_name_or_levels():
    assert ambience_settings("office").resolved()["bed"] == "office"
    custom = ambience_settings({"preset": "office", "bed_db": -30})
    assert custom.resolved()["bed_db"] == -30 and custom.resolved()["hiss_db"] == -68
