"""The source-filter waveform side of the next SSM voice, at the line's own 8 kHz.

Per 12.5 ms frame the network predicts F0 (and whether the frame is voiced) and three spectral
envelopes over 0-4 kHz, each as `N_COEF` DCT coefficients of a log magnitude in 201 bins of 20 Hz:

    S = exp(lh) STFT(pulses(f0)) + exp(ln) Z + exp(lr) e^{i phi}

a band-limited pulse train at F0 filtered by the harmonic envelope `lh`, white noise `Z` shaped by
`ln`, and a free-phase component shaped by `lr` with phase `phi` (random in unvoiced frames, the
pulse train's own in voiced ones: below); one inverse STFT (n_fft
400, hop 100, Hann) makes the waveform. This is hibari-tts's `dsp.py` (Apache-2.0) taken to 8 kHz:
its n_fft 1200 at 24 kHz and ours 400 at 8 kHz share the 20 Hz bin spacing and the 12.5 ms hop, so
its first 201 bins are ours. Measured on 12 held-out sentences (hibari's own predictions rendered
both ways): its 24 kHz output resampled to 8 kHz 1.1 % WER (Whisper tiny.en), DNSMOS OVRL 3.30; this
DSP 1.1 %, 3.30; with zero harmonic phase, random `phi` and 48 DCT coefficients per envelope (what
the student predicts) 2.2 %, about 3.2. Without the free-phase component it falls to 18.7 %, 2.52:
that component carries much of the speech.

The student predicts no phase, and hibari's learnt `phi` is what the rest of the gap is: its own
predictions with 48 coefficients and zero harmonic phase score DNSMOS OVRL 3.17 with random `phi`,
3.28 with its `phi` (3.28 with `phi` only in voiced frames, 3.17 with it only in unvoiced ones; its
`theta` does not help; 24 dev sentences, `agent_lines(24, seed=4242)`). Short of predicting `phi`,
voiced frames take the pulse train's own phase for the free-phase part (phi = arg P: the part
adds to the harmonics instead of hissing between them): 3.21 on the same predictions, and on
ssm:heart itself 3.15 -> 3.20 with WER 7.0 -> 6.3 % (40 dev sentences, plain tiny.en). Unvoiced
frames keep random `phi`.
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 8000
N_FFT = 400
HOP = 100  # 12.5 ms
N_BINS = N_FFT // 2 + 1  # 201, 20 Hz apart
N_COEF = 48  # DCT coefficients per envelope
ENVELOPES = ("lh", "ln", "lr")
F0_MIN = 40.0  # Hz: below this a frame is unvoiced
F_MAX = 3900.0  # the pulse train's highest harmonic
LOG_MAG_MAX = 7.0
TEACHER_GAIN = 1 / 3  # hibari's parameters are for a 1200-point inverse FFT: a third of the level here
# how voiced frames phase the free-phase part (below): the pulse train's own phase, or random (what
# a clone's spectral fit assumes; a clone from recordings is rendered locked all the same since
# 2026-12-05, a teacher's clone random: clone.export; a file says which, meta "free_phase")
LOCKED, RANDOM = "locked", "random"
WIN = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)  # periodic Hann
WIN_SRC = WIN / (N_FFT / 4)  # a unit cosine then has magnitude 1 in the STFT


def dct_basis(n_bins: int = N_BINS, n_coef: int = N_COEF) -> np.ndarray:
    """Orthonormal DCT-II basis (n_coef, n_bins): coefs = basis @ x, x ≈ basis.T @ coefs."""
    k = np.arange(n_coef)[:, None]
    n = np.arange(n_bins)[None, :]
    basis = np.cos(np.pi * k * (2 * n + 1) / (2 * n_bins)) * np.sqrt(2.0 / n_bins)
    basis[0] /= np.sqrt(2.0)
    return basis.astype(np.float32)


BASIS = dct_basis()


def to_coefs(log_mag: np.ndarray) -> np.ndarray:
    """(N_BINS, F) log magnitudes → (F, N_COEF)."""
    return (BASIS @ log_mag[:N_BINS]).T.astype(np.float32)


def from_coefs(coefs: np.ndarray) -> np.ndarray:
    """(F, N_COEF) → (N_BINS, F) log magnitudes."""
    return (coefs @ BASIS).T


def formant_warp(ratio: float) -> np.ndarray:
    """(N_COEF, N_COEF): an envelope's coefficients -> those of the same envelope with every feature
    at `ratio` times its frequency (formants of a longer vocal tract: ratio < 1; about 0.84 from an
    adult woman's to a man's). Bins the warp reads past the top take the top bin's value. Applied as
    `coefs @ formant_warp(r).T`; 1 is the identity up to the DCT's truncation."""
    if not 0.5 <= ratio <= 2.0:
        raise ValueError(f"formant ratio {ratio}: expected 0.5 to 2")
    k = np.arange(N_BINS)
    src = np.minimum(k / ratio, N_BINS - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, N_BINS - 1)
    w = src - lo
    resample = np.zeros((N_BINS, N_BINS))
    np.add.at(resample, (k, lo), 1 - w)
    np.add.at(resample, (k, hi), w)
    return (BASIS @ resample @ BASIS.T).astype(np.float32)


def harmonic_level(f0_ratio: float) -> float:
    """The log-magnitude change that keeps voiced power when F0 is scaled by `f0_ratio`: the pulse
    train's harmonics have unit amplitude, so 1/f0_ratio times as many fall in each band."""
    return 0.5 * float(np.log(f0_ratio))


LOG_LEVEL_TO_COEF = float(np.sqrt(N_BINS))  # a constant log-magnitude offset is this times it in coefficient 0


def pulses(f0: np.ndarray, start_phase: float = 0.0) -> tuple[np.ndarray, float]:
    """Band-limited pulse train, HOP samples per F0 value (F0 linearly interpolated between frame
    centres), every harmonic below F_MAX at unit amplitude; unvoiced frames are silent. Returns the
    samples and the phase to continue from (a stream calls it frame by frame)."""
    f0 = np.asarray(f0, np.float64)
    if not len(f0):
        return np.zeros(0, np.float32), start_phase
    x = np.arange(len(f0) * HOP) / HOP - 0.5 + 0.5 / HOP
    return pulse_samples(np.interp(x, np.arange(len(f0)), f0), start_phase)


def pulse_samples(f: np.ndarray, phase: float = 0.0) -> tuple[np.ndarray, float]:
    """The pulse train for a per-sample F0 (Hz), from `phase` (in cycles); returns it and the phase
    to continue from. sum_{h<=H} cos(h t) = sin((H+1/2) t) / (2 sin(t/2)) - 1/2."""
    if not len(f):
        return np.zeros(0, np.float32), phase
    voiced = f > F0_MIN
    f = np.maximum(f, F0_MIN)
    cycles = phase + np.cumsum(f) / SAMPLE_RATE  # double precision: the phase runs for seconds
    # within a cycle single precision is plenty; cycles are positive, so their fraction is exactly
    # cycles - floor(cycles) (np.remainder took half the pulse train's time)
    t = ((cycles - np.floor(cycles)) * 2 * np.pi).astype(np.float32)
    harmonics = (np.floor(F_MAX / f) + 0.5).astype(np.float32)
    s = 2 * np.sin(t * 0.5)
    near = np.abs(s) <= 2e-3
    s[near] = 1
    e = np.sin(harmonics * t) / s
    e[near] = harmonics[near]
    e -= 0.5
    e[~voiced] = 0
    return e.astype(np.float32), float(cycles[-1] % 1.0)


def frame_spectra(excitation: np.ndarray, frames: int) -> np.ndarray:
    """STFT (centred, reflect padding) of the pulse train: (N_BINS, frames) complex."""
    padded = np.pad(excitation, N_FFT // 2, mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:frames] * WIN_SRC
    return np.fft.rfft(windows, axis=1).T.astype(np.complex64)


def spectra(coefs: np.ndarray, f0: np.ndarray, rng: np.random.Generator, free_phase: str = LOCKED) -> np.ndarray:
    """(F, 3, N_COEF) envelopes and (F,) F0 → (N_BINS, F) complex spectra of the whole utterance."""
    frames = len(f0)
    lh, ln, lr = (np.minimum(from_coefs(coefs[:, i]), LOG_MAG_MAX) for i in range(3))
    pulse = frame_spectra(pulses(f0)[0], frames)
    spec = pulse * np.exp(lh)
    noise = rng.standard_normal((N_BINS, 2 * frames), dtype=np.float32).view(np.complex64)
    spec += noise * np.exp(ln)
    phase = rng.uniform(-np.pi, np.pi, (N_BINS, frames)).astype(np.float32)
    free = np.cos(phase) + 1j * np.sin(phase)
    if free_phase == LOCKED:
        free = np.where((np.asarray(f0) > F0_MIN)[None, :], unit_phase(pulse), free)
    spec += np.exp(lr) * free
    return spec


def unit_phase(spectrum: np.ndarray) -> np.ndarray:
    """The spectrum's phase as unit phasors: what a voiced frame's free-phase part takes (LOCKED)."""
    return spectrum / np.maximum(np.abs(spectrum), 1e-9)


def overlap_add(spec: np.ndarray) -> np.ndarray:
    """Inverse STFT matching a centred analysis: windowed inverse FFT per frame, overlap-added,
    normalised by the summed squared window."""
    frames = spec.shape[1]
    k = N_FFT // HOP
    pieces = (np.fft.irfft(spec.T, N_FFT, axis=1) * WIN).astype(np.float32).reshape(frames, k, HOP)
    out = np.zeros((frames + k - 1, HOP), np.float32)
    weight = np.zeros_like(out)
    w2 = (WIN * WIN).reshape(k, HOP)
    for i in range(k):
        out[i:i + frames] += pieces[:, i]
        weight[i:i + frames] += w2[i]
    out /= np.maximum(weight, 1e-11)
    half = N_FFT // 2
    return out.reshape(-1)[half: half + frames * HOP]


def synthesize(coefs: np.ndarray, f0: np.ndarray, seed: int = 0, free_phase: str = LOCKED) -> np.ndarray:
    """Envelopes and F0 of a whole utterance → 8 kHz float samples."""
    return overlap_add(spectra(coefs, f0, np.random.default_rng(seed), free_phase)) * TEACHER_GAIN
