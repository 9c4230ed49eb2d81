"""Streaming resampling between the line's 8 kHz and a WebRTC codec's 48 kHz, 20 ms at a time.

A windowed-sinc FIR at the higher rate with its state carried from chunk to chunk (polyphase in
effect: zeros are inserted to go up, every n-th sample is kept to go down). Each 20 ms chunk gives
exactly one 20 ms chunk back, 1 ms later (the filter's group delay).

Why not soxr's stream: at 20 ms chunks it releases output in blocks (measured here: HQ gives
nothing for seven 48 kHz → 8 kHz chunks, then 140 ms at once; MQ every third or fourth chunk; only
its quick "QQ" mode is steady, and that is a cubic interpolator without an anti-alias filter). On a
live line that is up to 140 ms of added delay and bursts that break the 20 ms pacing.
"""

from __future__ import annotations

import numpy as np
from scipy.signal import firwin, lfilter

TAPS_PER_PHASE = 16  # filter length = TAPS_PER_PHASE · ratio + 1: 97 taps for 8 ↔ 48 kHz
PASSBAND = 0.9  # of the lower rate's Nyquist frequency: 3.6 kHz for 8 kHz


class Resampler:
    """One direction of one call's audio, between rates in an integer ratio (8 ↔ 16, 24, 48 kHz)."""

    def __init__(self, in_rate: int, out_rate: int):
        if in_rate % out_rate == 0:
            self.up, self.down = 1, in_rate // out_rate
        elif out_rate % in_rate == 0:
            self.up, self.down = out_rate // in_rate, 1
        else:
            raise ValueError(f"{in_rate} Hz → {out_rate} Hz is not an integer ratio")
        self.in_rate, self.out_rate = in_rate, out_rate
        ratio = max(self.up, self.down)
        high = max(in_rate, out_rate)
        self.taps = firwin(TAPS_PER_PHASE * ratio + 1, PASSBAND * min(in_rate, out_rate) / 2, fs=high)
        self.taps *= self.up  # zero insertion divides the level by the ratio
        self._state = np.zeros(len(self.taps) - 1)
        self._phase = 0  # where the next kept sample falls in the next chunk (going down)

    @property
    def delay_s(self) -> float:
        return (len(self.taps) - 1) / 2 / max(self.in_rate, self.out_rate)

    def process(self, samples: np.ndarray) -> np.ndarray:
        """int16 samples in, int16 samples out (len · out_rate / in_rate of them, over time)."""
        x = samples.astype(np.float64)
        if self.up > 1:
            stuffed = np.zeros(len(x) * self.up)
            stuffed[::self.up] = x
            x = stuffed
        if len(x) == 0:
            return np.zeros(0, dtype=np.int16)
        y, self._state = lfilter(self.taps, 1.0, x, zi=self._state)
        if self.down > 1:
            y = y[self._phase::self.down]
            self._phase = (self._phase - len(x)) % self.down
        return np.clip(np.round(y), -32768, 32767).astype(np.int16)
