"""Streaming noise suppression: noisereduce's stationary spectral gate, one 20 ms frame at a time.

`noisereduce.reduce_noise()` costs ~95 ms per call whatever the block (measured here), so calling it
per frame is not real time, and gating separate blocks clicks at their joins. This stage keeps
noisereduce's method and its mask-smoothing filter but runs it as a continuous short-time Fourier
transform: sqrt-Hann analysis and synthesis windows (40 ms, 10 ms hop) overlap-added, so there are
no block joins at all. The noise profile (mean and spread of each bin's level in dB) is learnt
continuously from frames that sit near the recent noise floor (a sliding minimum), so it follows a
car starting or a fan switching on; a line that is digitally silent between words lets everything
through. The mask is smoothed over 500 Hz like noisereduce's and over
time with the filter's past half plus `LOOKAHEAD_HOPS` of look-ahead.

Latency: (window - hop) + look-ahead = 40 ms; the output frame lags the input by that much.
"""

from __future__ import annotations

import collections

import numpy as np

from callcenter.audio.frames import FRAME_SAMPLES, SAMPLE_RATE, AudioFrame
from callcenter.audio.stage import Moment

WIN = 320                       # 40 ms
HOP = 80                        # 10 ms: two hops per 20 ms frame
N_BINS = WIN // 2 + 1
LOOKAHEAD_HOPS = 1
N_STD_THRESH = 1.5              # noisereduce's n_std_thresh_stationary
PROP_DECREASE = 1.0             # noisereduce's default: gate noise bins fully
FREQ_SMOOTH_HZ = 500.0          # noisereduce's freq_mask_smooth_hz
TIME_SMOOTH_MS = 50.0           # noisereduce's time_mask_smooth_ms
FLOOR_WINDOW_S = 1.5            # the noise floor is the quietest hop in this long
NOISE_MARGIN_DB = 6.0           # hops this close to the floor update the noise profile
NOISE_ALPHA = 0.03              # noise profile update rate per qualifying hop
NOISE_ALPHA_FAST = 0.5          # ... and for hops far below the current profile
INITIAL_STD_DB = 3.0
DB_FLOOR = -100.0               # digital silence counts as a (very quiet) noise floor
EPS = 1e-12



def smoothing_filter(n_grad_freq: int, n_grad_time: int) -> np.ndarray:
    """noisereduce's mask-smoothing kernel (MIT, Tim Sainburg: `spectralgate.base._smoothing_filter`):
    triangular over frequency and over time, normalised to sum 1. Copied so that the package, whose
    import pulls matplotlib, joblib and torch when installed, is not needed at run time."""
    def triangle(n: int) -> np.ndarray:
        return np.concatenate([np.linspace(0, 1, n + 1, endpoint=False), np.linspace(1, 0, n + 2)])[1:-1]

    kernel = np.outer(triangle(n_grad_freq), triangle(n_grad_time))
    return kernel / np.sum(kernel)

class Denoiser:
    """One call's streaming noise gate: `process(frame, at)` -> the frame `LATENCY_MS` ago, denoised."""

    LATENCY_MS = (WIN - HOP + LOOKAHEAD_HOPS * HOP) * 1000 // SAMPLE_RATE

    def __init__(self):
        self.window = np.sqrt(0.5 - 0.5 * np.cos(2 * np.pi * np.arange(WIN) / WIN))
        n_grad_freq = max(1, int(FREQ_SMOOTH_HZ / (SAMPLE_RATE / (WIN / 2))))
        n_grad_time = max(1, int(TIME_SMOOTH_MS / (HOP / SAMPLE_RATE * 1000)))
        kernel = smoothing_filter(n_grad_freq, n_grad_time)     # (freq taps, time taps), symmetric
        centre = kernel.shape[1] // 2
        kernel = kernel[:, : centre + LOOKAHEAD_HOPS + 1]         # past half + bounded look-ahead
        self.freq_taps = kernel.sum(axis=1) / kernel.sum(axis=1).sum()
        self.time_taps = kernel.sum(axis=0) / kernel.sum(axis=0).sum()   # oldest ... newest
        self.masks = collections.deque([np.ones(N_BINS)] * len(self.time_taps), maxlen=len(self.time_taps))
        self.specs = collections.deque([np.zeros(N_BINS, complex)] * (LOOKAHEAD_HOPS + 1),
                                       maxlen=LOOKAHEAD_HOPS + 1)
        self.input = np.zeros(WIN)
        self.output = np.zeros(WIN)
        self.noise_mean = np.zeros(N_BINS)
        self.noise_var = np.zeros(N_BINS)
        self.levels = collections.deque(maxlen=int(FLOOR_WINDOW_S * SAMPLE_RATE / HOP))
        self.noise_level = DB_FLOOR
        self.hops = 0

    def process(self, frame: AudioFrame, at: Moment) -> AudioFrame:
        x = np.frombuffer(frame.pcm, dtype="<i2").astype(np.float64) / 32768
        out = np.concatenate([self._hop(x[i:i + HOP]) for i in range(0, FRAME_SAMPLES, HOP)])
        return AudioFrame((np.clip(out, -1, 1) * 32767).astype("<i2").tobytes())

    def _hop(self, samples: np.ndarray) -> np.ndarray:
        self.input = np.concatenate([self.input[HOP:], samples])
        spec = np.fft.rfft(self.input * self.window)
        power = np.abs(spec) ** 2
        db = np.maximum(10 * np.log10(power + EPS), DB_FLOOR)
        self._learn_noise(db, 10 * np.log10(power.mean() + EPS))
        threshold = self.noise_mean + N_STD_THRESH * np.sqrt(self.noise_var)
        mask = (db > threshold) * PROP_DECREASE + (1.0 - PROP_DECREASE)
        half = len(self.freq_taps) // 2
        self.masks.append(np.convolve(np.pad(mask, half, mode="edge"), self.freq_taps, mode="valid"))
        self.specs.append(spec)
        gain = np.tensordot(self.time_taps, np.asarray(self.masks), axes=1)   # for the look-ahead'th hop
        frame = np.fft.irfft(self.specs[0] * gain, n=WIN) * self.window
        self.output = np.concatenate([self.output[HOP:], np.zeros(HOP)]) + frame
        return self.output[:HOP] / 2.0      # sqrt-Hann x sqrt-Hann at 75 % overlap sums to 2

    def _learn_noise(self, db: np.ndarray, level: float) -> None:
        """Update the noise profile from hops near the recent floor (sliding minimum of hop energy).
        A hop well below the current profile (the caller spoke first, then paused) pulls it down fast."""
        self.levels.append(level)
        self.hops += 1
        if self.hops == 1:
            self.noise_mean, self.noise_var = db.copy(), np.full(N_BINS, INITIAL_STD_DB ** 2)
            self.noise_level = level
            return
        if level > min(self.levels) + NOISE_MARGIN_DB:
            return
        weight = NOISE_ALPHA_FAST if level < self.noise_level - NOISE_MARGIN_DB else NOISE_ALPHA
        delta = db - self.noise_mean
        self.noise_mean += weight * delta
        self.noise_var = (1 - weight) * (self.noise_var + weight * delta * delta)
        self.noise_level += weight * (level - self.noise_level)
