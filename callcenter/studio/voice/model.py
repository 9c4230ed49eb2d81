"""The SSM voice: phoneme ids -> durations and pitch -> frames -> causal SSM decoder -> waveform.

    ids ─▶ embedding + voice embedding ─▶ conv encoder ─▶ duration predictor (frames per id)
                                                      └▶ pitch predictor (per id, normalised log F0)
    encoder + pitch ─▶ length regulation (+ position inside the phoneme) ─▶ gated S4D blocks, causal
    ─▶ per frame: log magnitude and phase of a 40 ms spectrum ─▶ inverse FFT ─▶ overlap-add (10 ms hop)

This module is the torch model used for training (parallel over time). `runtime.py` runs the same
network for synthesis in numpy, a few 10 ms frames per step from a running state. The waveform lags
its conditioning frame by `DELAY` samples: the decoder sees two frames ahead of what it sounds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from callcenter.studio.voice.ssm import GatedSsmBlock
from callcenter.voice.phonemes import SYMBOLS
from callcenter.voice.spectrum import HOP, LOG_MAG_MAX, N_BINS, OLA_GAIN, WIN


@dataclass
class ModelConfig:
    dim: int = 128
    encoder_layers: int = 4
    decoder_layers: int = 8
    state: int = 16
    expand: int = 2
    voices: list[str] = field(default_factory=lambda: ["joe"])
    n_symbols: int = len(SYMBOLS)

    def to_dict(self) -> dict:
        return asdict(self)


class ConvLayer(nn.Module):
    def __init__(self, dim: int, kernel: int = 5):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, kernel, padding=kernel // 2)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, mask):
        """x: (B, L, D), mask: (B, L, 1)."""
        y = self.conv((x * mask).transpose(1, 2)).transpose(1, 2)
        return self.norm(x + F.gelu(y, approximate="tanh")) * mask


class Predictor(nn.Module):
    """Two conv layers and a linear read-out: one number per phoneme id."""

    def __init__(self, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([ConvLayer(dim, 3), ConvLayer(dim, 3)])
        self.out = nn.Linear(dim, 1)

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return self.out(x).squeeze(-1) * mask.squeeze(-1)


def regulate(x: torch.Tensor, durations: torch.Tensor, position: nn.Linear) -> torch.Tensor:
    """Length regulation: (B, L, D) states, (B, L) frames per id → (B, T, D), each frame told where
    it is inside its phoneme ((pos + 0.5) / duration, 1 / duration) through `position`."""
    rows = []
    for b in range(x.shape[0]):
        d = durations[b]
        frames = torch.repeat_interleave(x[b], d, dim=0)
        starts = torch.repeat_interleave(torch.cumsum(d, 0) - d, d)
        dur = torch.repeat_interleave(d, d).float()
        pos = (torch.arange(len(starts), device=x.device) - starts).float()
        rows.append(frames + position(torch.stack([(pos + 0.5) / dur, 1.0 / dur], dim=-1)))
    return nn.utils.rnn.pad_sequence(rows, batch_first=True)


class VoiceModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        d = config.dim
        self.embed = nn.Embedding(config.n_symbols, d)
        self.voice_embed = nn.Embedding(len(config.voices), d)
        self.encoder = nn.ModuleList([ConvLayer(d) for _ in range(config.encoder_layers)])
        self.duration = Predictor(d)
        self.pitch = Predictor(d)
        self.pitch_embed = nn.Conv1d(1, d, 3, padding=1)
        self.position = nn.Linear(2, d)
        self.decoder_in = nn.Linear(d, d)
        self.decoder = nn.ModuleList([GatedSsmBlock(d, config.state, config.expand) for _ in range(config.decoder_layers)])
        self.decoder_norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 2 * N_BINS)
        self.register_buffer("window", torch.hann_window(WIN, periodic=True), persistent=False)
        # per voice: mean and std of log F0 (Hz), set from the training data
        self.register_buffer("pitch_stats", torch.tensor([[math.log(120.0), 0.2]] * len(config.voices)))

    # ---- text side -------------------------------------------------------------------------------
    def encode(self, ids: torch.Tensor, voice: torch.Tensor, mask: torch.Tensor):
        """ids: (B, L) -> encoder states (B, L, D), log-duration and pitch predictions (B, L)."""
        x = (self.embed(ids) + self.voice_embed(voice)[:, None, :]) * mask
        for layer in self.encoder:
            x = layer(x, mask)
        return x, self.duration(x, mask), self.pitch(x, mask)

    def condition(self, enc, pitch, durations):
        """Length regulation: (B, L, D) states and (B, L) frames per id -> (B, T, D) decoder input."""
        return regulate(enc + self.pitch_embed(pitch[:, None, :]).transpose(1, 2), durations, self.position)

    # ---- acoustic side ---------------------------------------------------------------------------
    def decode(self, cond: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, 2 * N_BINS) spectral parameters, causal in T."""
        x = self.decoder_in(cond)
        for block in self.decoder:
            x = block(x)
        return self.head(self.decoder_norm(x))

    def frames_to_audio(self, params: torch.Tensor) -> torch.Tensor:
        """(B, T, 2 * N_BINS) -> (B, T * HOP) samples: windowed inverse FFT per frame, overlap-added."""
        frames = self._frames(params)                                          # (B, T, WIN)
        b, t, _ = frames.shape
        out = F.fold(frames.transpose(1, 2), output_size=(1, (t - 1) * HOP + WIN),
                     kernel_size=(1, WIN), stride=(1, HOP))
        return out.reshape(b, -1)[:, : t * HOP] / OLA_GAIN

    def _frames(self, params: torch.Tensor) -> torch.Tensor:
        log_mag, phase = params.split(N_BINS, dim=-1)
        mag = log_mag.clamp(max=LOG_MAG_MAX).exp()
        spec = torch.complex(mag * torch.cos(phase), mag * torch.sin(phase))
        return torch.fft.irfft(spec, n=WIN) * self.window

    def forward(self, ids, voice, mask, durations, pitch):
        """Teacher-forced training pass: predictions for the losses and the decoder's conditioning."""
        enc, log_dur, pitch_pred = self.encode(ids, voice, mask)
        cond = self.condition(enc, pitch, durations)
        return cond, log_dur, pitch_pred


def export_voices(path, model: VoiceModel, extra: dict | None = None) -> None:
    """The committed voice file: a numpy archive (half precision, SSM dynamics in single precision),
    so synthesis needs numpy only. `runtime.SsmVoices` reads it."""
    arrays = {}
    for name, value in model.state_dict().items():
        keep32 = ".ssm." in name or name == "pitch_stats"
        arrays[name] = value.detach().cpu().numpy().astype("float32" if keep32 else "float16")
    meta = {"config": model.config.to_dict(), **(extra or {})}
    np.savez_compressed(path, __meta__=np.array(json.dumps(meta)), **arrays)
