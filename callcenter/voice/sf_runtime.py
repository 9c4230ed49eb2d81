"""Synthesis with the source-filter SSM voice in numpy, streamed a few frames at a time.

The text side runs once per sentence (phoneme encoder, durations, length regulation); the decoder
then runs as a recurrence from a carried state (`runtime.scan_fn`, the same closed-form chunk scan
the spectral voices use), `FRAMES_PER_STEP` frames a step, and `SourceFilterStream` turns each
step's F0 and envelopes into samples. A sample is final once every frame whose window covers it is
known: the stream runs `LAG_FRAMES` behind the decoder, so the first samples leave after the first
step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np

from callcenter.voice import source_filter as sf
from callcenter.voice.runtime import (FRAMES_PER_STEP, Recurrence, VoiceFileError, _conv_same, _gelu, _layer_norm,
                                      load_block, regulate, scan_fn)

LOG_F0_MEAN = 5.3
LAG_FRAMES = 3  # F0 interpolation (one frame ahead) and the 50 ms window (two frames each side)
OLA_NORM = 1.5  # summed squared Hann window at 4x overlap


class SourceFilterStream:
    """F0 and envelopes in, 8 kHz samples out, frame by frame: the pulse train continues its
    phase across steps, noise and free phase are drawn per frame once, and the overlap-add keeps
    the tail of windows still open."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.f0: list[float] = []
        self.spectra: list[np.ndarray] = []  # per frame: (N_BINS,) complex, without the harmonic part
        self.envelope: list[np.ndarray] = []  # per frame: exp(lh)
        self.pulse = np.zeros(sf.N_FFT // 2, np.float32)  # the pulse train from sample -N_FFT/2 on
        self.pulsed = 0  # frames whose pulse samples are made
        self.phase = 0.0
        self.done = 0  # frames whose windows are added
        self.ola = np.zeros(sf.N_FFT + 64 * sf.HOP, np.float32)
        self.emitted = 0  # samples returned so far

    def add(self, f0: np.ndarray, coefs: np.ndarray) -> None:
        """(K,) Hz and (K, 3, N_COEF)."""
        for i in range(len(f0)):
            lh, ln, lr = (np.minimum(sf.from_coefs(coefs[i:i + 1, j])[:, 0], sf.LOG_MAG_MAX) for j in range(3))
            noise = self.rng.standard_normal(2 * sf.N_BINS, dtype=np.float32).view(np.complex64)
            phase = self.rng.uniform(-np.pi, np.pi, sf.N_BINS).astype(np.float32)
            self.spectra.append(noise * np.exp(ln) + np.exp(lr) * (np.cos(phase) + 1j * np.sin(phase)))
            self.envelope.append(np.exp(lh))
            self.f0.append(float(f0[i]))

    def _make_pulses(self, upto: int) -> None:
        """Pulse samples for frames [pulsed, upto): frame k's samples interpolate F0 between the
        centres of k-1, k and k+1, so they need f0[k+1] (or the end)."""
        if upto <= self.pulsed:
            return
        lo = max(0, self.pulsed - 1)
        f0 = np.asarray(self.f0[lo:upto + 1], np.float64)
        x = np.arange(self.pulsed * sf.HOP, upto * sf.HOP) / sf.HOP - 0.5 + 0.5 / sf.HOP - lo
        f = np.interp(x, np.arange(len(f0)), f0)
        samples, self.phase = sf.pulse_samples(f, self.phase)
        self.pulse = np.concatenate([self.pulse, samples])
        self.pulsed = upto

    def _window(self, t: int) -> np.ndarray:
        start = t * sf.HOP  # in self.pulse, which begins N_FFT/2 before sample 0
        seg = self.pulse[start:start + sf.N_FFT]
        if len(seg) < sf.N_FFT:
            seg = np.pad(seg, (0, sf.N_FFT - len(seg)))
        spec = np.fft.rfft(seg * sf.WIN_SRC) * self.envelope[t] + self.spectra[t]
        return np.fft.irfft(spec, sf.N_FFT).astype(np.float32) * sf.WIN

    def samples(self, final: bool = False) -> np.ndarray:
        """Samples no later frame can change any more (all of them when `final`)."""
        known = len(self.f0)
        ready = known if final else max(0, known - LAG_FRAMES)
        self._make_pulses(known if final else max(0, known - 1))
        if final:
            self.pulse = np.concatenate([self.pulse, np.zeros(sf.N_FFT, np.float32)])
        while self.done < ready:
            t = self.done
            off = t * sf.HOP - self.emitted  # the window starts N_FFT/2 before frame t's centre
            need = off + sf.N_FFT
            if need > len(self.ola):
                self.ola = np.concatenate([self.ola, np.zeros(need - len(self.ola) + 16 * sf.HOP, np.float32)])
            self.ola[off:off + sf.N_FFT] += self._window(t)
            self.done += 1
        # output sample n (from n = 0) is ola index n + N_FFT/2 - emitted... kept relative: the
        # buffer's index 0 is sample emitted - N_FFT/2
        end = self.done * sf.HOP - sf.N_FFT // 2 if not final else self.done * sf.HOP
        count = max(0, end - self.emitted)
        out = self.ola[sf.N_FFT // 2: sf.N_FFT // 2 + count] / OLA_NORM * sf.TEACHER_GAIN
        self.ola = np.concatenate([self.ola[count:], np.zeros(count, np.float32)])
        self.emitted += count
        return out.astype(np.float32)


_LOADED: dict[str, "SfVoice"] = {}


def load_sf_voice(path) -> "SfVoice":
    key = str(path)
    if key not in _LOADED:
        _LOADED[key] = SfVoice(path)
    return _LOADED[key]


class SfVoice:
    """One trained source-filter voice file (`export_sf_voice`)."""

    @staticmethod
    def g2p():
        """text → phoneme id lists (one per phrase) in the voice's alphabet: hibari's G2P and
        vocabulary (Apache-2.0), without its network."""
        import os
        from types import SimpleNamespace

        from hibari import tts as hibari_tts
        from hibari.g2p import G2P

        with open(os.path.join(hibari_tts.ASSETS, "vocab.json"), encoding="utf-8") as f:
            vocab = json.load(f)
        front = SimpleNamespace(g2p=G2P(british=False), split_sentences=hibari_tts.Hibari.split_sentences)

        def ids(text: str) -> list[list[int]]:
            return [[0, *[vocab[c] for c in ph if c in vocab], 0]
                    for ph in hibari_tts.Hibari.phonemize(front, text) if ph.strip()]

        return ids

    def __init__(self, path: str | Path):
        path = Path(path)
        try:
            blob = np.load(path)
            self.meta = json.loads(str(blob["__meta__"]))
            self.p = {k: blob[k].astype(np.float32) for k in blob.files if k != "__meta__"}
        except (OSError, KeyError, ValueError) as exc:
            raise VoiceFileError(f"{path}: not a source-filter voice file ({exc})") from None
        self.config = self.meta["config"]
        p = self.p
        self.blocks = [load_block(p, f"decoder.{i}") for i in range(self.config["decoder_layers"])]
        self._scans = [scan_fn(b, FRAMES_PER_STEP) for b in self.blocks]
        self._dec_w, self._dec_b = p["decoder_in.weight"].T.copy(), p["decoder_in.bias"]
        self._head_w = (p["head.weight"].T * p["decoder_norm.weight"][:, None]).astype(np.float32)
        self._head_b = (p["decoder_norm.bias"] @ p["head.weight"].T + p["head.bias"]).astype(np.float32)

    def _conv_layer(self, prefix: str, x: np.ndarray) -> np.ndarray:
        p = self.p
        y = _conv_same(x, p[f"{prefix}.conv.weight"], p[f"{prefix}.conv.bias"])
        return _layer_norm(x + _gelu(y), p[f"{prefix}.norm.weight"], p[f"{prefix}.norm.bias"])

    def plan(self, ids: list[int], speed: float = 1.0) -> np.ndarray:
        """(T, D) decoder conditioning for one phrase of hibari phoneme ids."""
        p = self.p
        x = p["embed.weight"][np.asarray(ids)]
        for k in range(self.config["encoder_layers"]):
            x = self._conv_layer(f"encoder.{k}", x)
        d = x
        for k in range(2):
            d = self._conv_layer(f"duration.layers.{k}", d)
        log_dur = (d @ p["duration.out.weight"].T + p["duration.out.bias"])[:, 0]
        durations = np.maximum(np.round((np.exp(log_dur) - 1) / speed), 0).astype(int)
        if durations.sum() == 0:
            durations[len(ids) // 2] = 1
        return regulate(x, durations, p)

    def stream(self, cond: np.ndarray, cancelled=lambda: False, seed: int = 0) -> Iterator[np.ndarray]:
        """8 kHz float samples, a step's worth at a time."""
        dsp = SourceFilterStream(seed)
        for out in self.frames(cond, cancelled):
            f0 = np.where(out[:, 1] > 0, np.exp(out[:, 0] + LOG_F0_MEAN), 0.0)
            dsp.add(f0, out[:, 2:].reshape(len(out), 3, sf.N_COEF))
            samples = dsp.samples()
            if len(samples):
                yield samples
        if not cancelled():
            tail = dsp.samples(final=True)
            if len(tail):
                yield tail

    def frames(self, cond: np.ndarray, cancelled=lambda: False) -> Iterator[np.ndarray]:
        """The decoder as a recurrence: per step, (K, N_OUT) outputs for the next K frames, from
        the carried convolution windows and SSM states (the same function as the torch decoder)."""
        decoder = Recurrence(self.blocks, self._scans, self._dec_w, self._dec_b, self._head_w, self._head_b)
        for _, out in decoder.run(cond, cancelled):
            yield out


def export_sf_voice(path, model, extra: dict | None = None) -> None:
    """The voice file: half precision, the SSM dynamics in single precision; numpy reads it."""
    arrays = {}
    for name, value in model.state_dict().items():
        keep32 = ".ssm." in name
        arrays[name] = value.detach().cpu().numpy().astype("float32" if keep32 else "float16")
    meta = {"config": model.config.to_dict(), "kind": "source-filter", **(extra or {})}
    np.savez_compressed(path, __meta__=np.array(json.dumps(meta)), **arrays)
