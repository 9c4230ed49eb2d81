"""Phoneme durations for teacher audio that comes without them (flite): a framewise aligner.

1. A small convolutional classifier learns which phoneme symbol sounds in each 10 ms frame, from the
   teacher that reports exact durations (Piper). Random warps of the mel axis stand in for other
   speakers' vocal tracts.
2. For a new voice, its posteriors (divided by a damped class prior, `PRIOR_SCALE`) are forced through the known phoneme sequence with Viterbi: every
   id gets at least one frame, except the `_` gaps between symbols, which may take none.
3. Optionally the classifier is retrained on all voices with those alignments and the new voices
   are aligned again (one round of self-training).
"""

from __future__ import annotations

import math

import numpy as np
import structlog
import torch
import torch.nn.functional as F
from torch import nn

from callcenter.voice.phonemes import PAD, SYMBOL_ID, SYMBOLS
from callcenter.voice.spectrum import HOP, WIN

log = structlog.get_logger()

N_MELS = 40
F_MIN, F_MAX = 60.0, 3900.0
MIN_WARP, MAX_WARP = 0.85, 1.18
PRIOR_SCALE = 0.5   # posteriors divided by the class prior to this power: without it the frequent `_`
                    # gap soaks up most frames of an unfamiliar voice (phone:gap 1.3:4.3 frames on awb,
                    # against 2.6:2.4 on Piper's own timings; 0.5 gives 3.2:2.5)


def mel_filters(n_mels: int = N_MELS, n_fft: int = WIN, rate: int = 8000) -> np.ndarray:
    def hz_to_mel(f):
        return 2595 * np.log10(1 + f / 700)

    def mel_to_hz(m):
        return 700 * (10 ** (m / 2595) - 1)

    edges = mel_to_hz(np.linspace(hz_to_mel(F_MIN), hz_to_mel(F_MAX), n_mels + 2))
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    fb = np.zeros((n_mels, len(freqs)), np.float32)
    for m in range(n_mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        fb[m] = np.clip(np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)), 0, None)
    return fb


_FB = mel_filters()


def log_mel(audio: np.ndarray) -> np.ndarray:
    """(frames, N_MELS), frame k centred on sample k * HOP, one frame per HOP of audio."""
    n = len(audio) // HOP
    padded = np.pad(audio, (WIN // 2, WIN))
    idx = np.arange(n)[:, None] * HOP + np.arange(WIN)[None, :]
    spec = np.abs(np.fft.rfft(padded[idx] * np.hanning(WIN), axis=1)) ** 2
    feats = np.log(spec @ _FB.T + 1e-6)
    return (feats - feats.mean(0)).astype(np.float32)


class AlignerNet(nn.Module):
    def __init__(self, channels: int = 96, layers: int = 4):
        super().__init__()
        self.inp = nn.Conv1d(N_MELS, channels, 5, padding=2)
        self.layers = nn.ModuleList([nn.Conv1d(channels, channels, 5, padding=2) for _ in range(layers)])
        self.norms = nn.ModuleList([nn.BatchNorm1d(channels) for _ in range(layers)])
        self.out = nn.Conv1d(channels, len(SYMBOLS), 1)
        self.register_buffer("log_prior", torch.full((len(SYMBOLS),), -math.log(len(SYMBOLS))))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """(B, T, N_MELS) -> (B, T, symbols) log-probabilities."""
        x = F.gelu(self.inp(mel.transpose(1, 2)))
        for conv, norm in zip(self.layers, self.norms):
            x = x + F.gelu(norm(conv(x)))
        return F.log_softmax(self.out(x).transpose(1, 2), dim=-1)


def _warp(mel: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    factor = rng.uniform(MIN_WARP, MAX_WARP)
    src = np.clip(np.arange(N_MELS) / factor, 0, N_MELS - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, N_MELS - 1)
    frac = src - lo
    return (mel[:, lo] * (1 - frac) + mel[:, hi] * frac).astype(np.float32)


def frame_labels(ids: np.ndarray, durations: np.ndarray) -> np.ndarray:
    return np.repeat(ids, durations)


def train_aligner(utts: list[dict], steps: int = 600, batch: int = 8, seed: int = 0) -> AlignerNet:
    """`utts`: dicts with audio, ids and durations (see teachers.load_dataset)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    data = [(log_mel(u["audio"]), frame_labels(u["ids"], u["durations"])) for u in utts]
    net = AlignerNet()
    counts = np.bincount(np.concatenate([lab for _, lab in data]), minlength=len(SYMBOLS)) + 1.0
    net.log_prior.copy_(torch.tensor(np.log(counts / counts.sum()), dtype=torch.float32))
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    crop = 200
    for step in range(steps):
        mels, labels = [], []
        for k in rng.integers(0, len(data), batch):
            mel, lab = data[k]
            n = min(len(mel), len(lab))
            start = rng.integers(0, max(1, n - crop))
            m, y = _warp(mel[start:start + crop], rng), lab[start:start + crop]
            mels.append(torch.tensor(m))
            labels.append(torch.tensor(y[: len(m)]))
        mel_b = nn.utils.rnn.pad_sequence(mels, batch_first=True)
        lab_b = nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=-100)
        loss = F.nll_loss(net(mel_b).reshape(-1, len(SYMBOLS)), lab_b.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0:
            log.info("aligner_step", step=step, loss=round(loss.item(), 3))
    return net.eval()


def viterbi_durations(logp: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Best monotonic path of `ids` through frame log-probabilities (T, symbols) -> frames per id.
    Every id takes at least one frame except PAD gaps, which may be skipped."""
    t_len, m = len(logp), len(ids)
    emit = logp[:, ids]                                   # (T, M)
    skippable = np.zeros(m, bool)
    skippable[1:] = ids[:-1] == SYMBOL_ID[PAD]            # j may be reached from j-2 when j-1 is a gap
    neg = -1e30
    score = np.full(m, neg)
    score[0] = emit[0, 0]
    if ids[0] == SYMBOL_ID[PAD] and m > 1:
        score[1] = emit[0, 1]
    back = np.zeros((t_len, m), np.int8)                  # 0 stay, 1 from j-1, 2 from j-2
    for t in range(1, t_len):
        stay = score
        step = np.concatenate([[neg], score[:-1]])
        skip = np.where(skippable, np.concatenate([[neg, neg], score[:-2]]), neg)
        cands = np.stack([stay, step, skip])
        choice = cands.argmax(0)
        back[t] = choice
        score = cands[choice, np.arange(m)] + emit[t]
    end = m - 1
    if ids[-1] == SYMBOL_ID[PAD] and score[m - 2] > score[m - 1]:
        end = m - 2
    durations = np.zeros(m, np.int64)
    j = end
    for t in range(t_len - 1, -1, -1):
        durations[j] += 1
        j -= int(back[t, j])
    return durations


def align(net: AlignerNet, utts: list[dict]) -> None:
    """Fill in `durations` for every utterance, in place."""
    with torch.no_grad():
        for u in utts:
            mel = log_mel(u["audio"])
            logp = net(torch.tensor(mel)[None])[0] - PRIOR_SCALE * net.log_prior
            u["durations"] = viterbi_durations(logp.numpy(), u["ids"])
