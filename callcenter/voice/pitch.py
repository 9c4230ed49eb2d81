"""Fundamental frequency per acoustic frame (YIN), for training the voice's pitch predictor."""

from __future__ import annotations

import numpy as np

from callcenter.audio.frames import SAMPLE_RATE

F0_MIN_HZ = 60.0
F0_MAX_HZ = 400.0
YIN_THRESHOLD = 0.15
WINDOW = 320          # 40 ms: two periods of the lowest pitch


def yin_f0(audio: np.ndarray, hop: int, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """F0 in Hz for each hop of `audio` (float), 0 where unvoiced. Frame k is centred on sample k*hop."""
    tau_min = int(sample_rate / F0_MAX_HZ)
    tau_max = int(sample_rate / F0_MIN_HZ)
    n_frames = len(audio) // hop
    half = WINDOW // 2
    padded = np.pad(audio.astype(np.float64), (half, half + tau_max + WINDOW))
    starts = np.arange(n_frames) * hop
    idx = starts[:, None] + np.arange(WINDOW + tau_max)[None, :]
    frames = padded[idx]                                           # (T, W + tau_max)
    base = frames[:, :WINDOW]
    energy_total = (base ** 2).sum(1) + 1e-9
    n_fft = 1 << int(np.ceil(np.log2(WINDOW + tau_max + WINDOW)))
    # cross-correlation of the window with the lagged signal, for every lag at once
    corr = np.fft.irfft(np.conj(np.fft.rfft(base, n_fft)) * np.fft.rfft(frames, n_fft), n_fft)[:, :tau_max + 1]
    sq = np.concatenate([np.zeros((n_frames, 1)), np.cumsum(frames ** 2, axis=1)], axis=1)
    lagged_energy = sq[:, WINDOW:WINDOW + tau_max + 1] - sq[:, :tau_max + 1]
    diff = energy_total[:, None] + lagged_energy - 2 * corr
    diff[:, 0] = 0
    cum = np.cumsum(diff[:, 1:], axis=1) / np.arange(1, tau_max + 1)
    cmnd = np.ones_like(diff)
    cmnd[:, 1:] = diff[:, 1:] / (cum + 1e-9)
    f0 = np.zeros(n_frames)
    region = cmnd[:, tau_min:tau_max]
    below = region < YIN_THRESHOLD
    has = below.any(1)
    first = np.argmax(below, axis=1)
    for i in np.nonzero(has)[0]:
        t = first[i]
        while t + 1 < region.shape[1] and region[i, t + 1] < region[i, t]:
            t += 1
        f0[i] = sample_rate / (t + tau_min)
    quiet = energy_total < (np.percentile(energy_total, 95) * 1e-3)
    f0[quiet] = 0.0
    return f0.astype(np.float32)
