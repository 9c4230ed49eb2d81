"""Phone lines for the hearing benchmarks and tests: background talkers, the agent's own voice
echoing back, mixing at a given signal-to-noise ratio. Everything is made here from this project's
voices, so no recording is needed and every run is the same for a given seed."""

from __future__ import annotations

import numpy as np

from callcenter.audio.frames import SAMPLE_RATE

BABBLE_TALKERS = 6
BABBLE_LINES = [
    "I'm sorry, could you say that again? The line is terrible.",
    "We shipped the order on Monday and it should arrive by Thursday afternoon.",
    "Let me check with my supervisor and I'll call you right back.",
    "The meeting moved to three o'clock in the large conference room.",
    "Did you see the game last night? It went into overtime.",
    "Please hold while I look up your account details.",
    "My daughter starts school next week, so mornings are busy.",
    "The printer on the second floor is out of paper again.",
    "I think the invoice was sent to the wrong address.",
    "Can you transfer this call to the claims department?",
    "We close at six today but open early tomorrow.",
    "The weather is supposed to clear up by the weekend.",
]


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)) + 1e-20))


def active_rms(x: np.ndarray, frame: int = 160) -> float:
    """RMS over the frames within 30 dB of the loudest: the level of the speech, not its pauses."""
    n = len(x) // frame
    if n == 0:
        return rms(x)
    energy = np.mean(x[: n * frame].reshape(n, frame) ** 2, axis=1)
    loud = energy[energy > energy.max() * 1e-3]
    return float(np.sqrt(loud.mean()))


SPECTRAL_VOICES = ("joe", "awb", "slt")  # the spectral model file's voices (ssm-voices.npz)


def spectral_speak(text: str, voice: str, speed: float = 1.0) -> np.ndarray:
    """`text` in one of the spectral model file's voices, float samples at 8 kHz. The hearing
    corpus, babble and the hearing bench's agent prompts were made with them; since 2026-12-07
    `ssm:awb` and `ssm:slt` name source-filter clones of the same flite speakers, so this lab
    material reads the spectral file directly and stays what the committed hearing learnt and was
    measured on."""
    import threading

    from callcenter.voice.ssm_tts import SsmTts

    return np.concatenate(list(SsmTts(voice, speed).samples(text, threading.Event())))


def babble(seconds: float, seed: int = 0) -> np.ndarray:
    """Background talkers: BABBLE_TALKERS voices saying different lines at once, unit RMS."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    out = np.zeros(n)
    voices = SPECTRAL_VOICES
    for talker in range(BABBLE_TALKERS):
        track = np.zeros(0)
        while len(track) < n:
            line = BABBLE_LINES[rng.integers(len(BABBLE_LINES))]
            x = spectral_speak(line, voices[talker % len(voices)], speed=float(rng.uniform(0.85, 1.15)))
            track = np.concatenate([track, x, np.zeros(int(rng.uniform(0.05, 0.4) * SAMPLE_RATE))])
        start = int(rng.integers(0, len(track) - n + 1))
        out += track[start:start + n] * rng.uniform(0.6, 1.0)
    return out / rms(out)


def white(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(int(seconds * SAMPLE_RATE))


def noise_at(noise: np.ndarray, speech_rms: float, snr_db: float) -> np.ndarray:
    """`noise` scaled to sit `snr_db` below speech of RMS `speech_rms`."""
    return noise / rms(noise) * speech_rms * 10 ** (-snr_db / 20)


def place(into: np.ndarray, x: np.ndarray, at_s: float) -> np.ndarray:
    """`into` with `x` added from `at_s` seconds (cut at the end)."""
    out = into.copy()
    i = int(at_s * SAMPLE_RATE)
    if i < len(out):
        m = min(len(x), len(out) - i)
        out[i:i + m] += x[:m]
    return out
