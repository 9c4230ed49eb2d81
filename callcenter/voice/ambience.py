"""Phone-line ambience: the small noises callers expect, added to everything the agent sends.

A perfectly clean, silent line sounds uncanny on a phone. This stage runs on each outgoing 20 ms
frame (speech or silence), after the voice and before the transport, and can add:

- telephone band-limiting (300-3400 Hz) and the character of G.711 µ-law companding;
- line hiss, mains hum (50 or 60 Hz and its harmonics) and comfort noise while the agent is silent;
- a background bed, generated here: ``office`` (ventilation, keyboards) or ``callcenter`` (a murmur
  of distant talkers and keyboards), ducked under the agent's voice so it never masks speech.

Every level is in dBFS. Presets: ``clean`` (nothing: the default), ``office``, ``callcenter``,
``mobile``; a flow picks a preset and may override single levels, or sets ``enabled: false``.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import signal

from callcenter.audio.frames import FRAME_SAMPLES, SAMPLE_RATE, AudioFrame
from callcenter.audio.g711 import ulaw_roundtrip
from callcenter.audio.stage import Moment
from callcenter.voice.settings import AmbienceSettings

BAND_LOW_HZ, BAND_HIGH_HZ = 300.0, 3400.0
VOICE_ACTIVE_DBFS = -45.0       # a frame louder than this is agent speech: duck the bed
DUCK_RELEASE_S = 0.35
TALKERS = 6
HUM_HARMONICS = 7


def _gain(db: float | None) -> float:
    return 0.0 if db is None else 10 ** (db / 20)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x * x)) + 1e-12)


class _Bed:
    """A procedural background: each call gets its own, continuous across frames, unit RMS on average."""

    def __init__(self, kind: str, rng: np.random.Generator):
        self.kind = kind
        self.rng = rng
        self.vent = signal.butter(2, 400, fs=SAMPLE_RATE, output="sos")
        self.vent_zi = np.zeros((self.vent.shape[0], 2))
        self.speech = signal.butter(2, [300, 2500], btype="band", fs=SAMPLE_RATE, output="sos")
        self.talker_zi = np.zeros((self.speech.shape[0], 2))
        self.talker_env = np.zeros(TALKERS)
        self.talker_target = rng.uniform(0, 1, TALKERS)
        self.click = 0.0
        self.click_decay = np.exp(-np.arange(FRAME_SAMPLES) / (0.004 * SAMPLE_RATE))

    def frame(self) -> np.ndarray:
        n = FRAME_SAMPLES
        out = np.zeros(n)
        if self.kind in ("office", "callcenter"):
            vent, self.vent_zi = signal.sosfilt(self.vent, self.rng.standard_normal(n), zi=self.vent_zi)
            out += 0.6 * vent
            if self.rng.random() < (0.12 if self.kind == "office" else 0.2):  # a key press now and then
                burst = self.rng.standard_normal(n) * self.click_decay * self.rng.uniform(0.5, 2.0)
                out += np.roll(burst, self.rng.integers(0, n // 2))
        if self.kind == "callcenter":
            # syllable-rate envelopes on speech-shaped noise; the envelopes hold still within a frame,
            # so one filter serves all talkers
            moving = self.rng.random(TALKERS) < 0.08
            self.talker_target[moving] = np.where(self.rng.random(moving.sum()) < 0.5, 0.0,
                                                  self.rng.uniform(0.3, 1.0, moving.sum()))
            self.talker_env += 0.25 * (self.talker_target - self.talker_env)
            mix = self.talker_env @ self.rng.standard_normal((TALKERS, n)) / np.sqrt(TALKERS)
            voices, self.talker_zi = signal.sosfilt(self.speech, mix, zi=self.talker_zi)
            out += 2.0 * voices
        return out


LOOP_S = 60  # each noise is rendered once per process as a seamless loop this long
LOOP_SAMPLES = LOOP_S * SAMPLE_RATE  # a whole number of frames and of hum periods
LOOP_SEED = 20261203
SEAM_SAMPLES = SAMPLE_RATE // 10  # equal-power crossfade where the loop's end meets its start


def _seamless(render) -> np.ndarray:
    """LOOP_SAMPLES of `render(n)` whose end runs into its start without a click."""
    y = render(LOOP_SAMPLES + SEAM_SAMPLES)
    fade = np.sin(np.linspace(0, np.pi / 2, SEAM_SAMPLES))
    loop = y[:LOOP_SAMPLES].copy()
    loop[:SEAM_SAMPLES] = y[:SEAM_SAMPLES] * fade + y[LOOP_SAMPLES:] * fade[::-1]
    return loop.astype(np.float32)


@functools.lru_cache(maxsize=8)
def _loops(bed: str, bed_db, hiss_db, hum_db, hum_hz: int, comfort_db) -> tuple:
    """(bed, steady, comfort) loops at their levels, None where off; shared by every call in the
    process, so a call pays a few array additions per frame instead of generating noise."""
    rng = np.random.default_rng(LOOP_SEED)

    def bed_render(n: int) -> np.ndarray:
        source = _Bed(bed, rng)
        return np.concatenate([source.frame() for _ in range(-(-n // FRAME_SAMPLES))])[:n]

    bed_loop = _seamless(bed_render) * _gain(bed_db) if bed != "none" else None
    steady = np.zeros(LOOP_SAMPLES)
    if hiss_db is not None:
        steady += _seamless(rng.standard_normal) * _gain(hiss_db)
    if hum_db is not None:
        t = np.arange(LOOP_SAMPLES) / SAMPLE_RATE
        steady += sum(np.sin(2 * np.pi * hum_hz * h * t) / h for h in range(1, HUM_HARMONICS + 1, 2)) \
            * _gain(hum_db) / 1.2
    steady_loop = steady.astype(np.float32) if (hiss_db is not None or hum_db is not None) else None
    comfort = _seamless(rng.standard_normal) * _gain(comfort_db) if comfort_db is not None else None
    return bed_loop, steady_loop, comfort


class Ambience:
    """Per-call processor: `process(pcm)` on each outgoing 20 ms frame, on the transport's clock.
    The noises come from loops rendered once per process; each call starts at its own point in
    them (from `seed`), so two calls do not hear the same background at the same time."""

    def __init__(self, settings: AmbienceSettings | None = None, seed: int = 0):
        self.settings = settings or AmbienceSettings()
        v = self.settings.resolved()
        self.enabled = self.settings.enabled and any(
            [v["band_limit"], v["mulaw"], v["hiss_db"] is not None, v["hum_db"] is not None,
             v["comfort_db"] is not None, v["bed"] != "none"])
        self.v = v
        # transfer-function form: per 20 ms frame, lfilter costs a fifth of sosfilt's checks
        self.band_b, self.band_a = signal.butter(4, [BAND_LOW_HZ, BAND_HIGH_HZ], btype="band", fs=SAMPLE_RATE)
        self.band_zi = np.zeros(len(self.band_a) - 1)
        self.bed = self.steady = self.comfort = None
        if self.enabled:
            self.bed, self.steady, self.comfort = _loops(v["bed"], v["bed_db"], v["hiss_db"], v["hum_db"],
                                                         v["hum_hz"], v["comfort_db"])
        self.duck = 1.0
        self.release = np.exp(-FRAME_SAMPLES / SAMPLE_RATE / DUCK_RELEASE_S)
        self.at = int(np.random.default_rng(seed).integers(0, LOOP_SAMPLES // FRAME_SAMPLES)) * FRAME_SAMPLES

    def _band_limited(self, x: np.ndarray, silent: bool) -> np.ndarray:
        if silent and not self.band_zi.any():  # nothing in, nothing ringing: nothing out
            return x
        x, self.band_zi = signal.lfilter(self.band_b, self.band_a, x, zi=self.band_zi)
        if silent and np.abs(self.band_zi).max() < 1e-9:
            self.band_zi[:] = 0.0
        return x

    def process(self, frame: AudioFrame, at: Moment) -> AudioFrame:
        if not self.enabled:
            return frame
        pcm = frame.pcm
        v = self.v
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768
        silent = not x.any()
        speaking = not silent and 20 * np.log10(_rms(x)) > VOICE_ACTIVE_DBFS
        if v["band_limit"]:
            x = self._band_limited(x, silent)
        part = slice(self.at, self.at + FRAME_SAMPLES)
        self.at = (self.at + FRAME_SAMPLES) % LOOP_SAMPLES
        if self.bed is not None:
            target = 10 ** (-v["duck_db"] / 20) if speaking else 1.0
            self.duck = target if target < self.duck else target + (self.duck - target) * self.release
            x = x + self.bed[part] * self.duck
        if self.steady is not None:
            x = x + self.steady[part]
        if self.comfort is not None and not speaking:
            x = x + self.comfort[part]
        out = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
        if v["mulaw"]:
            out = ulaw_roundtrip(out)
        return AudioFrame(out)
