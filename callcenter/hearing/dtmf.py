"""In-band DTMF: keypad tones inside the caller's audio, for peers that do not send RFC 4733 events
(a keypad held up to a microphone, old gateways, a WebRTC leg).

A Goertzel filter bank over a 205-sample window (25.6 ms, the classic choice at 8 kHz: 39 Hz bins
that separate the eight tones), slid every 10 ms. A window holds a digit when one row tone and one
column tone stand well above the other tones of their group, together carry most of the window's
power (speech spreads its power; a tone pair does not), their second harmonics are weak (vowels
have strong harmonics), the twist between them is within ITU-T Q.24's limits and both are loud
enough. A digit is reported once it has held for `MIN_ON_HOPS` windows (≥ 40 ms of tone) and not
again until the tone has stopped for `MIN_OFF_HOPS`.
"""

from __future__ import annotations

import numpy as np

from callcenter.audio.frames import SAMPLE_RATE, AudioFrame
from callcenter.audio.stage import Moment

ROWS = (697.0, 770.0, 852.0, 941.0)
COLS = (1209.0, 1336.0, 1477.0, 1633.0)
KEYS = ("123A", "456B", "789C", "*0#D")
WINDOW = 205  # samples: 25.6 ms
HOP = 80  # samples: 10 ms
MIN_TONE_DBFS = -45.0  # each tone at least this loud (about -42 dBm0)
MAX_TWIST_DB = 8.0  # column tone weaker than the row tone (normal twist)
MAX_REVERSE_TWIST_DB = 6.0  # row tone weaker than the column tone
GROUP_MARGIN_DB = 8.0  # the chosen tone above every other tone of its group
TONE_SHARE = 0.75  # of the window's power in the two tones (speech spreads it)
HARMONIC_MARGIN_DB = 12.0  # each tone above its second harmonic
MIN_ON_HOPS = 3  # windows in a row with the same digit: 40 ms and more of tone
MIN_OFF_HOPS = 2  # windows without it before the same key counts again


def _basis(freqs: tuple[float, ...]) -> np.ndarray:
    """Cosine and sine at each frequency over the window: power at f = |x @ basis|^2."""
    n = np.arange(WINDOW)
    return np.exp(-2j * np.pi * np.outer(n, freqs) / SAMPLE_RATE)


class InbandDtmf:
    """One call's in-band DTMF detector: `process(frame, at)` returns the keys that went down in it."""

    def __init__(self) -> None:
        self.window = np.hamming(WINDOW)
        # a sine of amplitude A puts (A * sum(w) / 2)^2 in its bin and A^2 / 2 * sum(w^2) in the window
        self.full_scale_db = 10 * np.log10((np.sum(self.window) / 2) ** 2 / 2)  # a 0 dBFS-RMS tone
        self.share_scale = 2 * np.sum(self.window ** 2) / np.sum(self.window) ** 2
        self.tones = _basis(ROWS + COLS)
        self.harmonics = _basis(tuple(2 * f for f in ROWS + COLS))
        self.buffer = np.zeros(0)
        self.candidate: str | None = None
        self.run = 0
        self.reported: str | None = None
        self.off = 0

    @property
    def tone_on(self) -> bool:
        """A keypad tone is sounding (the last window held one, or a reported key is still down)."""
        return self.candidate is not None or self.reported is not None

    def process(self, frame: AudioFrame, at: Moment) -> list[str]:
        self.buffer = np.concatenate([self.buffer, frame.as_float().astype(np.float64)])
        keys = []
        while len(self.buffer) >= WINDOW:
            key = self._detect(self.buffer[:WINDOW])
            self.buffer = self.buffer[HOP:]
            if (pressed := self._debounce(key)) is not None:
                keys.append(pressed)
        return keys

    def _detect(self, x: np.ndarray) -> str | None:
        x = x * self.window
        energy = float(np.dot(x, x)) + 1e-12
        power = np.abs(x @ self.tones) ** 2
        rows, cols = power[:4], power[4:]
        r, c = int(np.argmax(rows)), int(np.argmax(cols))
        db = 10 * np.log10(power + 1e-12)
        row_db, col_db = db[r] - self.full_scale_db, db[4 + c] - self.full_scale_db
        if min(row_db, col_db) < MIN_TONE_DBFS:
            return None
        if col_db - row_db > MAX_REVERSE_TWIST_DB or row_db - col_db > MAX_TWIST_DB:
            return None
        others_r = np.delete(db[:4], r)
        others_c = np.delete(db[4:], c)
        if db[r] - others_r.max() < GROUP_MARGIN_DB or db[4 + c] - others_c.max() < GROUP_MARGIN_DB:
            return None
        if (rows[r] + cols[c]) * self.share_scale / energy < TONE_SHARE:
            return None
        harmonic = 10 * np.log10(np.abs(x @ self.harmonics[:, [r, 4 + c]]) ** 2 + 1e-12)
        if db[r] - harmonic[0] < HARMONIC_MARGIN_DB or db[4 + c] - harmonic[1] < HARMONIC_MARGIN_DB:
            return None
        return KEYS[r][c]

    def _debounce(self, key: str | None) -> str | None:
        """Report a key once it has held MIN_ON_HOPS windows; again only after MIN_OFF_HOPS without it."""
        if key is not None and key == self.candidate:
            self.run += 1
        else:
            self.candidate, self.run = key, 1 if key is not None else 0
        if self.reported is not None:
            self.off = 0 if key == self.reported else self.off + 1
            if self.off >= MIN_OFF_HOPS:
                self.reported = None
        if self.reported is None and key is not None and self.run >= MIN_ON_HOPS:
            self.reported, self.off = key, 0
            return key
        return None


def dtmf_tone(key: str, seconds: float = 0.1, level_dbfs: float = -10.0) -> np.ndarray:
    """The tone pair of `key` (each tone at `level_dbfs`), float samples at 8 kHz; for tests and benches."""
    for r, row in enumerate(KEYS):
        if key in row:
            c = row.index(key)
            break
    else:
        raise ValueError(f"{key!r} is not a DTMF key")
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    amplitude = 10 ** (level_dbfs / 20) * np.sqrt(2)
    return amplitude * (np.sin(2 * np.pi * ROWS[r] * t) + np.sin(2 * np.pi * COLS[c] * t))
