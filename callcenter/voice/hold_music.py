"""Music on hold, made here: a slow arpeggiated chord progression of soft bell-like tones, written
for the phone line. Every note's fundamental and its loud partials lie inside the 300–3400 Hz
telephone band, the level sits at about -20 dBFS (well inside µ-law's range, so the quantiser's
noise stays ~35 dB under it), there is no noise-like content for a codec or a noise gate to chew
on, and the loop joins without a click. Rendered once per process."""

from __future__ import annotations

import functools

import numpy as np

from callcenter.audio.frames import FRAME_SAMPLES, SAMPLE_RATE

BEAT_S = 0.375  # 160 bpm eighths: a calm arpeggio
LEVEL_DBFS = -20.0
# I – vi – IV – V in C, voiced in the telephone band (MIDI note numbers; C5 = 72)
CHORDS = ((64, 67, 72, 76), (64, 69, 72, 76), (65, 69, 72, 77), (67, 71, 74, 79))
PATTERN = (0, 1, 2, 3, 2, 1, 2, 3)  # notes of the chord, one per beat
BARS_PER_CHORD = 1


def _tone(freq: float, seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    env = np.minimum(1.0, t / 0.01) * np.exp(-t * 2.2)  # a soft strike, a long ring
    wave = np.sin(2 * np.pi * freq * t) + 0.35 * np.sin(2 * np.pi * 2 * freq * t) * np.exp(-t * 3)
    return env * wave


@functools.lru_cache(maxsize=1)
def hold_music() -> bytes:
    """The loop, 8 kHz 16-bit PCM, a whole number of 20 ms frames (about 12 s)."""
    beat = int(BEAT_S * SAMPLE_RATE)
    steps = [(chord, i) for chord in CHORDS for _ in range(BARS_PER_CHORD) for i in PATTERN]
    total = beat * len(steps)
    total -= total % FRAME_SAMPLES
    out = np.zeros(total + 4 * SAMPLE_RATE)
    for k, (chord, i) in enumerate(steps):
        freq = 440.0 * 2 ** ((chord[i] - 69) / 12)
        note = _tone(freq, 2.5)
        start = k * beat
        out[start:start + len(note)] += note
        if i == 0:  # the chord's root an octave down (still above 300 Hz), held under the arpeggio
            low = _tone(freq / 2 if freq / 2 >= 320 else freq, 3.0) * 0.5
            out[start:start + len(low)] += low
    loop = out[:total].copy()
    loop[:len(out) - total] += out[total:]  # the tails of the last notes ring into the start: no seam
    rms = np.sqrt(np.mean(loop ** 2))
    loop *= 10 ** (LEVEL_DBFS / 20) * 32767 / rms
    return np.clip(loop, -32767, 32767).astype("<i2").tobytes()
