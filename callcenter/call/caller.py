"""The simulated caller of `simulate` and `flows test`: a voice to speak their lines, and the echo
of the agent's own voice that comes back on their line."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import numpy as np

from callcenter.audio import g711
from callcenter.audio.frames import SAMPLE_RATE, float_to_pcm, pcm_to_float

ECHO_DELAY_MS = 60  # bulk delay of the echo path (jitter buffers, the far end's hybrid)
ECHO_GAIN_DB = -15.0  # echo return loss: how much quieter the echo is than what the agent sent


def speak(text: str, voice: str = "joe", speed: float = 1.0) -> np.ndarray:
    """`text` in one of this project's voices ("joe", "awb", "slt", "heart") or a Debian flite
    voice ("flite:kal"), float samples at 8 kHz."""
    if voice.startswith("flite:"):
        from callcenter.audio.wavfile import read_wav
        from callcenter.voice.flite import flite_voice
        from callcenter.voice.text import normalize

        with tempfile.TemporaryDirectory() as tmp:
            wav = flite_voice(normalize(text), Path(tmp) / "caller.wav", voice.split(":", 1)[1])
            return pcm_to_float(read_wav(wav))
    from callcenter.voice.ssm_tts import ssm_tts

    return np.concatenate(list(ssm_tts(voice, speed=speed).samples(text, threading.Event())))


class EchoPath:
    """What comes back of the agent's voice, frame by frame: delayed, a short multipath tail,
    attenuated, through G.711 µ-law."""

    def __init__(self, delay_ms: float = ECHO_DELAY_MS, gain_db: float = ECHO_GAIN_DB):
        d = int(delay_ms * SAMPLE_RATE / 1000)
        self.path = np.zeros(d + 48)
        self.path[d], self.path[d + 5], self.path[d + 17], self.path[d + 40] = 1.0, -0.35, 0.2, 0.08
        self.path *= 10 ** (gain_db / 20)
        self.history = np.zeros(len(self.path) - 1)

    def frame(self, sent: np.ndarray) -> np.ndarray:
        x = np.concatenate([self.history, sent])
        self.history = x[len(x) - len(self.history):]
        y = np.convolve(x, self.path, mode="valid")
        return pcm_to_float(g711.ulaw_roundtrip(float_to_pcm(y)))
