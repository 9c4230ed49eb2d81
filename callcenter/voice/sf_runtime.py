"""Synthesis with the source-filter SSM voice in numpy, streamed a few frames at a time.

The text side runs once per sentence (phoneme encoder, durations, length regulation); the decoder
then runs as a recurrence from a carried state (`runtime.scan_fn`, the same closed-form chunk scan
the spectral voices use), `FRAMES_PER_FIRST_STEP` frames in the first step (first audio) and
growing steps after it (`runtime.SECOND_STEP_FRAMES`...), and `SourceFilterStream` turns each
step's F0 and envelopes into samples. A sample is final once every frame whose window covers it is
known: the stream runs `LAG_FRAMES` behind the decoder, so the first samples leave after the first
step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import numpy as np

from callcenter.voice import source_filter as sf
from callcenter.voice.runtime import (
    SCAN_CHUNK_FRAMES,
    Recurrence,
    VoiceFileError,
    conv_layer,
    frames_per_id,
    load_block,
    predict,
    regulate,
    scan_fn,
)

LOG_F0_MEAN = 5.3
# the first step's frames: its audio, all but LAG_FRAMES of them (137 ms), plays while the second,
# longer step is made
FRAMES_PER_FIRST_STEP = 16
LAG_FRAMES = 3  # F0 interpolation (one frame ahead) and the 50 ms window (two frames each side)
OLA_NORM = 1.5  # summed squared Hann window at 4x overlap
OVERLAP = sf.N_FFT // sf.HOP  # windows covering each sample
# the noise and free-phase parts draw from fixed tables by random 16-bit index (a complex Gaussian,
# unit phasors evenly round the circle): two cheap draws per bin instead of normals, a uniform, a cos
# and a sin (bench tts: a fifth of the DSP's time)
DRAW_TABLE = 1 << 16
GAUSSIAN = np.random.default_rng(8000).standard_normal(2 * DRAW_TABLE, dtype=np.float32).view(np.complex64)
PHASORS = np.exp(2j * np.pi * (np.arange(DRAW_TABLE) + 0.5) / DRAW_TABLE).astype(np.complex64)


class SourceFilterStream:
    """F0 and envelopes in, 8 kHz samples out, a step at a time: the pulse train continues its
    phase across steps, noise (and, in unvoiced frames, free phase) is drawn once per frame, and
    the overlap-add keeps the tail of windows still open. Each step's frames are done together
    (one matrix product for the envelopes, one FFT pair for the windows)."""

    def __init__(self, seed: int = 0, free_phase: str = sf.LOCKED):
        """`free_phase`: how voiced frames phase the free-phase part (`source_filter`): LOCKED to
        the pulse train, or RANDOM (as a cloned voice's spectral fit assumes)."""
        self.rng = np.random.default_rng(seed)
        self.lock = free_phase == sf.LOCKED
        self.f0 = np.zeros(0, np.float64)
        self.unharmonic = np.zeros((0, sf.N_BINS), np.complex64)  # per frame: noise and free-phase parts
        self.envelope = np.zeros((0, sf.N_BINS), np.float32)  # per frame: exp(lh)
        self.locked = np.zeros((0, sf.N_BINS), np.float32)  # per frame: exp(lr) where voiced (sf.spectra)
        self.pulse = np.zeros(sf.N_FFT // 2, np.float32)  # the pulse train from sample -N_FFT/2 on
        self.pulse_start = -(sf.N_FFT // 2)  # the sample self.pulse[0] is
        self.pulsed = 0  # frames whose pulse samples are made
        self.phase = 0.0
        self.done = 0  # frames whose windows are added
        self.first = 0  # frame index of row 0 of f0/unharmonic/envelope
        self.ola = np.zeros(sf.N_FFT, np.float32)  # samples from emitted - N_FFT/2 on
        self.emitted = 0

    def add(self, f0: np.ndarray, coefs: np.ndarray) -> None:
        """(K,) Hz and (K, 3, N_COEF)."""
        k = len(f0)
        logs = coefs.reshape(k * 3, sf.N_COEF) @ sf.BASIS
        mags = np.exp(np.minimum(logs, sf.LOG_MAG_MAX, out=logs), out=logs).reshape(k, 3, sf.N_BINS)
        draws = self.rng.integers(0, DRAW_TABLE, (2, k, sf.N_BINS), dtype=np.uint16)
        voiced = (np.asarray(f0) > sf.F0_MIN) & self.lock
        unharmonic = np.take(GAUSSIAN, draws[0]) * mags[:, 1]  # np.take: half the time of GAUSSIAN[draws[0]]
        free = ~voiced  # free phase only where it is random: a voiced frame's phase is the pulses' (samples)
        unharmonic[free] += np.take(PHASORS, draws[1][free]) * mags[free, 2]
        self.unharmonic = np.concatenate([self.unharmonic, unharmonic])
        self.locked = np.concatenate([self.locked, np.where(voiced[:, None], mags[:, 2], 0).astype(np.float32)])
        self.envelope = np.concatenate([self.envelope, mags[:, 0]])
        self.f0 = np.concatenate([self.f0, np.asarray(f0, np.float64)])

    @property
    def known(self) -> int:
        return self.first + len(self.f0)

    def _make_pulses(self, upto: int) -> None:
        """Pulse samples for frames [pulsed, upto): frame k's samples interpolate F0 between the
        centres of k-1, k and k+1, so they need f0[k+1] (or the end)."""
        if upto <= self.pulsed:
            return
        lo = max(self.first, self.pulsed - 1)
        f0 = self.f0[lo - self.first:upto + 1 - self.first]
        x = np.arange(self.pulsed * sf.HOP, upto * sf.HOP) / sf.HOP - 0.5 + 0.5 / sf.HOP - lo
        samples, self.phase = sf.pulse_samples(np.interp(x, np.arange(len(f0)), f0), self.phase)
        self.pulse = np.concatenate([self.pulse, samples])
        self.pulsed = upto

    def samples(self, final: bool = False) -> np.ndarray:
        """Samples no later frame can change any more (all of them when `final`)."""
        known = self.known
        ready = known if final else max(0, known - LAG_FRAMES)
        self._make_pulses(known if final else max(0, known - 1))
        if final:
            self.pulse = np.concatenate([self.pulse, np.zeros(sf.N_FFT, np.float32)])
        if ready > self.done:
            count = ready - self.done
            first = self.done * sf.HOP - sf.N_FFT // 2 - self.pulse_start     # frame done's window in self.pulse
            if first < 0 or len(self.pulse) - first < (count - 1) * sf.HOP + sf.N_FFT:  # as_strided checks nothing
                raise RuntimeError("source-filter stream: pulse samples missing for the windows")
            windows = np.lib.stride_tricks.as_strided(
                self.pulse[first:], (count, sf.N_FFT), (sf.HOP * self.pulse.itemsize, self.pulse.itemsize))
            rows = slice(self.done - self.first, ready - self.first)
            pulses = np.fft.rfft(windows * sf.WIN_SRC, axis=1)
            if self.lock:  # exp(lh) P + exp(lr) P / |P| in one complex product (sf.unit_phase)
                gain = np.abs(pulses)
                np.maximum(gain, 1e-9, out=gain)
                np.divide(self.locked[rows], gain, out=gain)
                gain += self.envelope[rows]
            else:
                gain = self.envelope[rows]
            spec = pulses * gain
            spec += self.unharmonic[rows]
            pieces = (np.fft.irfft(spec, sf.N_FFT, axis=1).astype(np.float32) * sf.WIN).reshape(count, OVERLAP, sf.HOP)
            base = self.emitted - sf.N_FFT // 2  # the sample ola[0] is (a multiple of HOP)
            off = self.done * sf.HOP - sf.N_FFT // 2 - base
            need = off + (count + OVERLAP - 1) * sf.HOP
            if need > len(self.ola):
                self.ola = np.concatenate([self.ola, np.zeros(need - len(self.ola), np.float32)])
            hops = self.ola[off:need].reshape(count + OVERLAP - 1, sf.HOP)      # a view: adds land in ola
            for i in range(OVERLAP):
                hops[i:i + count] += pieces[:, i]
            self.done = ready
        end = self.done * sf.HOP if final else self.done * sf.HOP - sf.N_FFT // 2
        count = max(0, end - self.emitted)
        out = self.ola[sf.N_FFT // 2: sf.N_FFT // 2 + count] / OLA_NORM * sf.TEACHER_GAIN
        self.ola = self.ola[count:]
        self.emitted += count
        self._forget()
        return out.astype(np.float32)

    def _forget(self) -> None:
        """Drop frames and pulse samples no window needs any more (a long sentence stays cheap)."""
        keep_from = max(0, min(self.done, self.pulsed) - 2)
        if keep_from > self.first:
            cut = keep_from - self.first
            self.f0, self.unharmonic, self.envelope = self.f0[cut:], self.unharmonic[cut:], self.envelope[cut:]
            self.locked = self.locked[cut:]
            self.first = keep_from
        drop = (self.done * sf.HOP - sf.N_FFT // 2) - self.pulse_start
        if drop > 0:
            self.pulse = self.pulse[drop:]
            self.pulse_start += drop


# hibari's G2P reads a lowercase "no." as the abbreviation, "number", wherever it stands: "Please
# say yes or no." came out "yes or number". Before a digit it is one ("no. 5"); elsewhere the word.
_NO_FULL_STOP = re.compile(r"\bno\.(?!\s*\d)")


def spoken_as_words(text: str) -> str:
    """`text` with what hibari's G2P would read as an abbreviation but is a word kept a word."""
    return _NO_FULL_STOP.sub("no .", text)


_LOADED: dict[str, "SfVoice"] = {}
# a voice file that holds no weights, only another voice's name and how its pitch (semitones) and
# formants (a frequency ratio) are moved: `voice derive`
DERIVED = "derived"


def base_voice_file(meta: dict, path) -> Path:
    """The file of the voice a derived voice file names (`meta["base"]`, a source-filter voice)."""
    from callcenter.voice.ssm_tts import sf_voice_files

    base = sf_voice_files().get(str(meta.get("base", "")))
    if base is None:
        raise VoiceFileError(f"{path}: derived from ssm:{meta.get('base')}, which this installation does not have")
    if read_meta(base).get("kind") == DERIVED:  # one level: `voice derive` resolves a derived base itself
        raise VoiceFileError(f"{path}: derived from ssm:{meta['base']}, itself a derived voice")
    return base


def read_meta(path) -> dict:
    """A voice file's metadata alone."""
    try:
        with np.load(path) as blob:
            return json.loads(str(blob["__meta__"]))
    except (OSError, KeyError, ValueError) as exc:
        raise VoiceFileError(f"{path}: not a source-filter voice file ({exc})") from None


def export_derived(path, base: str, pitch: float, formant: float, extra: dict | None = None) -> None:
    """A derived voice file: no weights, ssm:`base`'s spoken `pitch` semitones higher (lower when
    negative) with its formants at `formant` times their frequency."""
    _save(path, {"kind": DERIVED, "base": base, "pitch": float(pitch), "formant": float(formant), **(extra or {})}, {})


def hibari_vocab() -> dict[str, int]:
    """The source-filter voices' phoneme alphabet: hibari's misaki symbols and their ids."""
    import os

    from hibari import tts as hibari_tts

    with open(os.path.join(hibari_tts.ASSETS, "vocab.json"), encoding="utf-8") as f:
        return json.load(f)


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
        from types import SimpleNamespace

        from hibari import tts as hibari_tts
        from hibari.g2p import G2P

        vocab = hibari_vocab()
        front = SimpleNamespace(g2p=G2P(british=False), split_sentences=hibari_tts.Hibari.split_sentences)

        def ids(text: str) -> list[list[int]]:
            return [[0, *[vocab[c] for c in ph if c in vocab], 0]
                    for ph in hibari_tts.Hibari.phonemize(front, spoken_as_words(text)) if ph.strip()]

        return ids

    def __init__(self, path: str | Path):
        path = Path(path)
        try:
            blob = np.load(path)
            self.meta = json.loads(str(blob["__meta__"]))
            p = {k: blob[k].astype(np.float32) for k in blob.files if k != "__meta__"}
        except (OSError, KeyError, ValueError) as exc:
            raise VoiceFileError(f"{path}: not a source-filter voice file ({exc})") from None
        if self.meta.get("kind") == DERIVED:  # another voice's network, its pitch and formants moved
            base = load_sf_voice(base_voice_file(self.meta, path))
            self.meta = {**base.meta, **self.meta}
            self.net = base.net  # one copy of the weights and step matrices in the process
        else:
            self.net = _Network(p, self.meta["config"])
        formant = float(self.meta.get("formant", 1.0))
        self._warp = sf.formant_warp(formant).T.copy() if formant != 1.0 else None

    @property
    def p(self) -> dict[str, np.ndarray]:
        return self.net.p

    @property
    def config(self) -> dict:
        return self.net.config

    def plan(self, ids: list[int], speed: float = 1.0) -> np.ndarray:
        """(T, D) decoder conditioning for one phrase of hibari phoneme ids."""
        p = self.p
        x = p["embed.weight"][np.asarray(ids)]
        for k in range(self.config["encoder_layers"]):
            x = conv_layer(p, f"encoder.{k}", x)
        # a cloned voice speaks at its speaker's rate (`speed` in its file), times the flow's
        return regulate(x, frames_per_id(predict(p, "duration", x), speed * self.meta.get("speed", 1.0)), p)

    def stream(self, cond: np.ndarray, cancelled=lambda: False, seed: int = 0,
               pitch: float = 0.0) -> Iterator[np.ndarray]:
        """8 kHz float samples, a step's worth at a time; `pitch` shifts F0 in semitones."""
        dsp = SourceFilterStream(seed, self.meta.get("free_phase", sf.LOCKED))
        shift = 2.0 ** ((pitch + float(self.meta.get("pitch", 0.0))) / 12)  # the flow's, and a derived voice's
        # the harmonic envelope keeps the voiced power at the shifted F0 (sf.harmonic_level)
        level = sf.harmonic_level(shift) * sf.LOG_LEVEL_TO_COEF
        # a cloned voice's intonation: its predicted log F0 widened about its centre by `f0_spread`
        # (its speaker's range against what the adapted decoder predicts) and kept within its
        # speaker's `f0_range` (clone.py); a trained voice has neither (1, and no bound: a frame
        # predicted below F0_MIN stays unvoiced, as the pulse train takes it)
        spread = float(self.meta.get("f0_spread", 1.0))
        centre = float(self.meta.get("f0_centre", LOG_F0_MEAN)) - LOG_F0_MEAN
        lo, hi = np.log(self.meta["f0_range"]) - LOG_F0_MEAN if "f0_range" in self.meta else (-np.inf, np.inf)
        gain = float(self.meta.get("gain", 1.0))  # a cloned voice's level (clone.calibrate_level)
        for out in self.frames(cond, cancelled):
            log_f0 = np.clip(centre + spread * (out[:, 0] - centre), lo, hi)
            f0 = np.where(out[:, 1] > 0, np.exp(log_f0 + LOG_F0_MEAN) * shift, 0.0)
            coefs = out[:, 2:].reshape(len(out), 3, sf.N_COEF)
            if self._warp is not None:
                coefs = coefs @ self._warp
            if level:
                coefs = coefs.copy() if self._warp is None else coefs
                coefs[:, 0, 0] += level
            dsp.add(f0, coefs)
            samples = dsp.samples()
            if len(samples):
                yield samples * gain if gain != 1.0 else samples
        if not cancelled():
            tail = dsp.samples(final=True)
            if len(tail):
                yield tail * gain if gain != 1.0 else tail

    def frames(self, cond: np.ndarray, cancelled=lambda: False) -> Iterator[np.ndarray]:
        """The decoder as a recurrence: per step, (K, N_OUT) outputs for the next K frames, from
        the carried convolution windows and SSM states (the same function as the torch decoder)."""
        for _, out in self.net.recurrence().run(cond, cancelled):
            yield out


class _Network:
    """A voice file's weights as the numpy decoder runs them: the SSM blocks with their step
    matrices, and the input and output projections (a derived voice shares its base's)."""

    def __init__(self, p: dict[str, np.ndarray], config: dict):
        self.p, self.config = p, config
        self.blocks = [load_block(p, f"decoder.{i}") for i in range(config["decoder_layers"])]
        self.scans = [scan_fn(b, FRAMES_PER_FIRST_STEP) for b in self.blocks]  # the first step (first audio)
        # the rest; chunks as long as the first step's share its matrices rather than build them twice
        self.later = (self.scans if SCAN_CHUNK_FRAMES == FRAMES_PER_FIRST_STEP
                      else [scan_fn(b, SCAN_CHUNK_FRAMES) for b in self.blocks])
        self.dec_w, self.dec_b = p["decoder_in.weight"].T.copy(), p["decoder_in.bias"]
        self.head_w = (p["head.weight"].T * p["decoder_norm.weight"][:, None]).astype(np.float32)
        self.head_b = (p["decoder_norm.bias"] @ p["head.weight"].T + p["head.bias"]).astype(np.float32)

    def recurrence(self) -> Recurrence:
        """A fresh decoder state over these weights (one per utterance)."""
        return Recurrence(self.blocks, self.scans, self.dec_w, self.dec_b, self.head_w, self.head_b,
                          later=self.later)


def set_gain(path: str | Path, gain: float) -> None:
    """Rewrite the voice file at `path` with `gain` in its metadata (its samples are scaled by it)."""
    set_meta(path, gain=gain)


def set_meta(path: str | Path, **values) -> None:
    """Rewrite the voice file at `path` with `values` in its metadata, its weights as they were."""
    with np.load(path) as blob:
        arrays = {k: blob[k] for k in blob.files if k != "__meta__"}
        meta = {**json.loads(str(blob["__meta__"])), **values}
    _save(path, meta, arrays)


def _save(path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    np.savez_compressed(path, __meta__=np.array(json.dumps(meta)), **arrays)


def export_sf_voice(path, model, extra: dict | None = None) -> None:
    """The voice file: half precision, the SSM dynamics in single precision; numpy reads it."""
    arrays = {}
    for name, value in model.state_dict().items():
        keep32 = ".ssm." in name
        arrays[name] = value.detach().cpu().numpy().astype("float32" if keep32 else "float16")
    _save(path, {"config": model.config.to_dict(), "kind": "source-filter", **(extra or {})}, arrays)
