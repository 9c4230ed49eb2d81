"""Synthesis with the trained SSM voices in numpy: no torch at run time, a few frames per step.

`SsmVoices.plan()` runs the text side once per sentence (phoneme encoder, duration and pitch
predictors, length regulation). `SsmVoices.stream()` then runs the decoder as a recurrence: each step
reads `FRAMES_PER_STEP` conditioning frames, carries every block's convolution window and SSM state
forward, and turns the frames' spectra into samples by inverse FFT and overlap-add — the same function the torch model
computes in parallel during training (`tests/test_voice.py` checks the two agree).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from callcenter.errors import CallcenterError
from callcenter.voice.spectrum import CONV_TAPS, DELAY, HOP, LOG_MAG_MAX, N_BINS, OLA_GAIN, WIN

VOICES_FILE = Path(__file__).parent / "weights" / "ssm-voices.npz"
LN_EPS = 1e-5
FRAMES_PER_STEP = 8      # 80 ms of audio per recurrent step: one matrix product per block covers 8 frames
# The source-filter voices' steps after their first (`sf_runtime.FRAMES_PER_FIRST_STEP`) grow: the
# second covers SECOND_STEP_FRAMES, each later one STEP_GROWTH times the last, up to MAX_STEP_FRAMES.
# A step's cost per frame falls with its length (the scan does a step's chunks of SCAN_CHUNK_FRAMES
# in the same few products), and the audio made runs further ahead of the audio played with each
# step. bench tts: ssm:heart's real-time factor 0.0079 with 32-frame steps -> 0.0047 (hibari 0.0054
# in the same run; README, "bench tts"). Chunks of 16 rather than 32 frames: a block's step matrices
# are 1.3 MB instead of 3.1 (six blocks no longer outgrow the cache between two steps), and ssm:heart
# is about 8 % cheaper per second of speech (its RTF over hibari's, timed in pairs: 1.12 -> 1.03).
SCAN_CHUNK_FRAMES = 16
SECOND_STEP_FRAMES = 128
STEP_GROWTH = 4
MAX_STEP_FRAMES = 512


class VoiceFileError(CallcenterError, RuntimeError):
    pass


def _normalize(x):
    """Layer norm without its affine part (folded into the next linear layer where it can be);
    x: (L, D), a new array back (sums and a dot product per row: np.mean's own overhead was a
    tenth of a step's layer norms)."""
    scale = 1.0 / x.shape[-1]
    xc = x - x.sum(-1, keepdims=True) * scale
    var = np.einsum("...j,...j->...", xc, xc)[..., None]
    var *= scale
    var += LN_EPS
    xc /= np.sqrt(var, out=var)
    return xc


def _layer_norm(x, w, b):
    return _normalize(x) * w + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))))


def _silu(x):
    """x * sigmoid(x), one new array and no other."""
    t = np.negative(x)
    np.exp(t, out=t)
    t += 1
    return np.divide(x, t, out=t)


def _conv_same(x, w, b):
    """x: (L, C_in); w: (C_out, C_in, K) torch layout; 'same' padding; one matrix product."""
    k = w.shape[2]
    xp = np.zeros((len(x) + k - 1, x.shape[1]), np.result_type(x, np.float32))  # np.pad: 80 us a call
    xp[k // 2:k // 2 + len(x)] = x
    cols = np.stack([xp[j:j + len(x)] for j in range(k)], axis=-1)        # (L, C_in, K)
    return cols.reshape(len(x), -1) @ w.reshape(w.shape[0], -1).T + b


@dataclass
class _Block:
    """One gated SSM block, laid out channels-first for the recurrence: a step's E channels are
    rows of (E, K) arrays, so each channel's frames lie together for the scan."""
    in_w: np.ndarray      # (2E, D): w @ x.T, the block's layer norm folded in
    in_b: np.ndarray      # (2E, 1)
    conv_w: np.ndarray    # (taps, E, 1)
    conv_b: np.ndarray    # (E, 1)
    a_bar: np.ndarray     # (E, N) complex
    cb: np.ndarray        # (E, N) complex
    d: np.ndarray
    out_w: np.ndarray     # (E, D)
    out_b: np.ndarray


def load_block(p: dict, prefix: str) -> _Block:
    """A gated SSM block's weights from a voice file, ready for the recurrence (its layer norm's
    affine part folded into the input projection, the SSM discretised)."""
    g = lambda name: p[f"{prefix}.{name}"]  # noqa: E731
    dt = np.exp(g("ssm.log_dt").astype(np.float64))[:, None]
    a = -np.exp(g("ssm.log_a_real").astype(np.float64)) + 1j * g("ssm.a_imag").astype(np.float64)
    a_bar = np.exp(a * dt)
    c = g("ssm.c").astype(np.float64)
    cb = (c[..., 0] + 1j * c[..., 1]) * (a_bar - 1) / a
    in_w = g("in_proj.weight") * g("norm.weight")[None, :]          # layer norm's affine folded in
    in_b = g("norm.bias") @ g("in_proj.weight").T + g("in_proj.bias")
    return _Block(in_w.astype(np.float32), in_b.astype(np.float32)[:, None],
                  np.ascontiguousarray(g("conv.weight")[:, 0, :].T[..., None]), g("conv.bias")[:, None],
                  a_bar.astype(np.complex64), cb.astype(np.complex64), g("ssm.d"),
                  g("out_proj.weight").T.copy(), g("out_proj.bias"))


def scan_fn(b: _Block, k: int):
    """The SSM over a step of any multiple of k frames from a carried state, in closed form per
    chunk of k: y_i = sum_{j<=i} kernel[i-j] u_j + D u_i + 2 Re(sum_n C_n A_n^(i+1) s_n), and the
    state at the next chunk s' = A^k s + sum_j A^(k-1-j) u_j.
    Complex products are laid out as real batched matrix products (one per channel) whose rows are
    the step's chunks, so a long step costs three products, not three per chunk; the states at the
    chunks' starts are passed along elementwise, chunk-major so that each is one contiguous array.
    The state is complex64, viewed as interleaved (re, im) floats."""
    e, n = b.a_bar.shape
    powers = b.a_bar[..., None].astype(np.complex128) ** np.arange(k + 1)    # (E, N, k+1)
    kernel = 2 * np.einsum("en,enl->el", b.cb, powers[..., :k]).real         # (E, k)
    lag = np.arange(k)[None, :] - np.arange(k)[:, None]                       # output i minus input j
    toeplitz = np.where(lag >= 0, kernel[:, np.clip(lag, 0, None)], 0)       # (E, j, i)
    toeplitz = (toeplitz + np.eye(k) * b.d[:, None, None]).astype(np.float32)
    f = 2 * b.cb[:, :, None] * powers[..., 1:]                                # (E, N, i): 2 C A^(i+1)
    from_state = np.stack([f.real, -f.imag], axis=2).reshape(e, 2 * n, k).astype(np.float32)  # (E, 2N, i)
    g = powers[..., k - 1::-1][..., :k].transpose(0, 2, 1)                     # (E, j, N): A^(k-1-j)
    into_state = np.stack([g.real, g.imag], axis=-1).reshape(e, k, 2 * n)     # (E, j, 2N)
    into_state = into_state.astype(np.float32)
    a_k = powers[..., k].astype(np.complex64)

    def scan(u: np.ndarray, s: np.ndarray):
        """u: (E, L) with L a multiple of k; s: (E, N) complex64 → y (E, L), the state after."""
        chunks = u.shape[1] // k
        rows = u.reshape(e, chunks, k)
        gained = np.empty((chunks, e, 2 * n), np.float32)
        np.matmul(rows, into_state, out=gained.transpose(1, 0, 2))             # each chunk's input, into the state
        gained = gained.view(np.complex64)                                       # (chunks, E, N)
        starts = np.empty((chunks + 1, e, n), np.complex64)                    # the state at each chunk's start
        starts[0] = s
        for c in range(chunks):
            np.multiply(a_k, starts[c], out=starts[c + 1])
            starts[c + 1] += gained[c]
        y = np.matmul(rows, toeplitz)
        y += np.matmul(starts[:chunks].view(np.float32).transpose(1, 0, 2), from_state)
        return y.reshape(e, -1), starts[chunks]

    scan.k = k
    return scan


def conv_layer(p: dict, prefix: str, x: np.ndarray) -> np.ndarray:
    """`model.ConvLayer`: x + gelu(conv(x)), layer-normalised; x: (L, D)."""
    y = _conv_same(x, p[f"{prefix}.conv.weight"], p[f"{prefix}.conv.bias"])
    return _layer_norm(x + _gelu(y), p[f"{prefix}.norm.weight"], p[f"{prefix}.norm.bias"])


def predict(p: dict, prefix: str, x: np.ndarray) -> np.ndarray:
    """`model.Predictor`: two conv layers and a linear read-out, one number per id."""
    for k in range(2):
        x = conv_layer(p, f"{prefix}.layers.{k}", x)
    return (x @ p[f"{prefix}.out.weight"].T + p[f"{prefix}.out.bias"])[:, 0]


def frames_per_id(log_dur: np.ndarray, speed: float) -> np.ndarray:
    """Predicted log(1 + frames) → whole frames at `speed`; never an empty sentence."""
    durations = np.maximum(np.round((np.exp(log_dur) - 1) / speed), 0).astype(int)
    if durations.sum() == 0:
        durations[len(durations) // 2] = 1
    return durations


def regulate(x: np.ndarray, durations: np.ndarray, p: dict) -> np.ndarray:
    """Length regulation as in training (`model.regulate`): states repeated per frame, each told
    where it is inside its phoneme."""
    frames = np.repeat(x, durations, axis=0)
    starts = np.repeat(np.cumsum(durations) - durations, durations)
    dur = np.repeat(durations, durations).astype(np.float32)
    pos = np.arange(len(frames)) - starts
    feats = np.stack([(pos + 0.5) / dur, 1.0 / dur], axis=-1)
    return (frames + feats @ p["position.weight"].T + p["position.bias"]).astype(np.float32)


class Recurrence:
    """The decoder of gated SSM blocks as a recurrence: each step reads K conditioning frames and
    carries every block's convolution window and SSM state to the next."""

    def __init__(self, blocks: list[_Block], scans: list, dec_w, dec_b, head_w, head_b, later: list | None = None):
        """`scans` for the first step (and every step, without `later`); `later`, scans whose
        chunk is SCAN_CHUNK_FRAMES, for the growing steps after it."""
        self.blocks, self.scans, self.later = blocks, scans, later
        self.dec_w, self.dec_b, self.head_w, self.head_b = dec_w, dec_b, head_w, head_b

    def run(self, cond: np.ndarray, cancelled=lambda: False):
        """(frames in this step, their outputs) per step."""
        conv = [np.zeros((b.conv_w.shape[1], CONV_TAPS - 1), np.float32) for b in self.blocks]
        state = [np.zeros(b.a_bar.shape, np.complex64) for b in self.blocks]
        t0, scans, step, first = 0, self.scans, self.scans[0].k, True
        while t0 < len(cond):
            if cancelled():
                return
            real = min(step, len(cond) - t0)
            k_step = -(-real // scans[0].k) * scans[0].k                         # whole chunks
            x = np.zeros((k_step, cond.shape[1]), np.float32)
            x[:real] = cond[t0:t0 + real]
            x = x @ self.dec_w                                                   # (K, D), frames as rows
            x += self.dec_b
            for k, (b, scan) in enumerate(zip(self.blocks, scans)):
                h = b.in_w @ _normalize(x).T                                      # (2E, K), channels as rows
                h += b.in_b
                e = len(h) // 2
                window = np.concatenate([conv[k], h[:e]], axis=1)               # (E, taps-1+K)
                conv[k] = window[:, k_step:]
                u = window[:, :k_step] * b.conv_w[0]
                u += b.conv_b
                tap = np.empty_like(u)
                for j in range(1, CONV_TAPS):
                    u += np.multiply(window[:, j:j + k_step], b.conv_w[j], out=tap)
                y, state[k] = scan(_silu(u), state[k])
                y *= _silu(h[e:])
                x += y.T @ b.out_w
                x += b.out_b
            yield real, (_normalize(x) @ self.head_w + self.head_b)[:real]
            t0 += real
            if self.later is not None:
                # later steps grow, so the audio made stays further ahead of the audio played
                step = SECOND_STEP_FRAMES if first else min(MAX_STEP_FRAMES, STEP_GROWTH * step)
                scans, first = self.later, False


class SsmVoices:
    """All voices of one trained model file."""

    def __init__(self, path: str | Path = VOICES_FILE):
        path = Path(path)
        try:
            blob = np.load(path)
            meta = json.loads(str(blob["__meta__"]))
            p = {k: blob[k].astype(np.float32) for k in blob.files if k != "__meta__"}
        except (OSError, KeyError, ValueError) as exc:
            raise VoiceFileError(f"{path}: not a callcenter voice file ({exc})") from None
        self.meta = meta
        self.config = meta["config"]
        self.voices: list[str] = list(self.config["voices"])
        self.p = p
        self.blocks = [self._block(i) for i in range(self.config["decoder_layers"])]
        self._scan_cache: dict[int, list] = {}
        self._dec_w, self._dec_b = p["decoder_in.weight"].T.copy(), p["decoder_in.bias"]
        self._head_w = (p["head.weight"].T * p["decoder_norm.weight"][:, None]).astype(np.float32)
        self._head_b = (p["decoder_norm.bias"] @ p["head.weight"].T + p["head.bias"]).astype(np.float32)
        self.window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(WIN) / WIN)).astype(np.float32)
        self._scans(FRAMES_PER_STEP)  # build the step matrices now, not while the first caller waits

    def _block(self, i: int) -> _Block:
        return load_block(self.p, f"decoder.{i}")

    def voice_index(self, name: str) -> int:
        try:
            return self.voices.index(name)
        except ValueError:
            raise KeyError(f"unknown voice {name!r} (known: {', '.join(self.voices)})") from None

    # ---- text side -------------------------------------------------------------------------------
    def encode(self, ids: list[int], voice: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Encoder states (L, D), log(1 + frames) and normalised pitch per id."""
        p = self.p
        x = p["embed.weight"][np.asarray(ids)] + p["voice_embed.weight"][voice]
        for k in range(self.config["encoder_layers"]):
            x = conv_layer(p, f"encoder.{k}", x)
        return x, predict(p, "duration", x), predict(p, "pitch", x)

    def plan(self, ids: list[int], voice: int, speed: float = 1.0, pitch_shift: float = 0.0) -> np.ndarray:
        """(T, D) decoder conditioning for one sentence; `speed` > 1 is faster, `pitch_shift` in semitones."""
        p = self.p
        x, log_dur, pitch = self.encode(ids, voice)
        durations = frames_per_id(log_dur, speed)
        pitch = pitch + pitch_shift * math.log(2) / 12 / p["pitch_stats"][voice, 1]
        return self.condition(x, pitch, durations)

    def condition(self, enc: np.ndarray, pitch: np.ndarray, durations: np.ndarray) -> np.ndarray:
        p = self.p
        x = enc + _conv_same(pitch[:, None], p["pitch_embed.weight"], p["pitch_embed.bias"])
        return regulate(x, durations, p)

    # ---- acoustic side ---------------------------------------------------------------------------
    def stream(self, cond: np.ndarray, frames_per_step: int = FRAMES_PER_STEP,
               cancelled=lambda: False) -> Iterator[np.ndarray]:
        """float32 samples at 8 kHz, HOP per conditioning frame and the window's tail last (the
        first DELAY samples, lead-in, are dropped). Each step advances `frames_per_step` frames
        from the running state, at the same cost wherever it is in the utterance."""
        k_step = frames_per_step
        ola = np.zeros(WIN + k_step * HOP, np.float32)
        skip = DELAY
        decoder = Recurrence(self.blocks, self._scans(k_step), self._dec_w, self._dec_b, self._head_w, self._head_b)
        for real, params in decoder.run(cond, cancelled):
            frames = self._frames(params)
            for i, frame in enumerate(frames):
                ola[i * HOP:i * HOP + WIN] += frame
            out = ola[: real * HOP] / OLA_GAIN
            ola = np.concatenate([ola[real * HOP:], np.zeros(real * HOP, np.float32)])
            if skip:
                out, skip = out[skip:], max(0, skip - len(out))
            if len(out):
                yield out
        yield ola[: WIN - HOP] / OLA_GAIN

    def _scans(self, k: int):
        if k not in self._scan_cache:
            self._scan_cache[k] = [scan_fn(b, k) for b in self.blocks]
        return self._scan_cache[k]

    def _frames(self, params: np.ndarray) -> np.ndarray:
        log_mag, phase = params[:, :N_BINS], params[:, N_BINS:]
        spec = np.exp(np.minimum(log_mag, LOG_MAG_MAX)) * np.exp(1j * phase)
        return (np.fft.irfft(spec, n=WIN, axis=1) * self.window).astype(np.float32)
