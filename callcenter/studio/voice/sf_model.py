"""The source-filter SSM voice (training side, torch): phoneme ids → durations → length regulation →
causal gated S4D blocks → per 12.5 ms frame: log F0, voicing and three envelopes (`source_filter`).

    ids ─▶ embedding ─▶ conv encoder ─▶ duration predictor (log frames per id)
    encoder states, repeated per frame (+ position in the phoneme) ─▶ gated S4D blocks, causal
    ─▶ log F0, voiced logit, lh/ln/lr as N_COEF DCT coefficients each ─▶ source_filter DSP (numpy)

It learns from hibari-tts's own predictions (`hibari_teacher`): the same frames, envelopes and F0,
with its exact durations, so the losses are plain regressions, no alignment and no waveform loss.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from callcenter.studio.voice.model import ConvLayer, Predictor, regulate
from callcenter.studio.voice.ssm import GatedSsmBlock
from callcenter.voice.source_filter import N_COEF

N_OUT = 2 + 3 * N_COEF  # log F0, voiced logit, three envelopes
LOG_F0_MEAN = 5.3  # ~200 Hz; outputs are offsets from it


@dataclass
class SfConfig:
    n_symbols: int = 178  # hibari's vocabulary
    dim: int = 128
    encoder_layers: int = 4
    decoder_layers: int = 6
    state: int = 16
    expand: int = 2

    def to_dict(self) -> dict:
        return asdict(self)


class SfVoiceModel(nn.Module):
    def __init__(self, config: SfConfig):
        super().__init__()
        self.config = config
        d = config.dim
        self.embed = nn.Embedding(config.n_symbols, d)
        self.encoder = nn.ModuleList([ConvLayer(d) for _ in range(config.encoder_layers)])
        self.duration = Predictor(d)
        self.position = nn.Linear(2, d)
        self.decoder_in = nn.Linear(d, d)
        self.decoder = nn.ModuleList([GatedSsmBlock(d, config.state, config.expand)
                                      for _ in range(config.decoder_layers)])
        self.decoder_norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, N_OUT)

    def encode(self, ids, mask):
        x = self.embed(ids) * mask
        for layer in self.encoder:
            x = layer(x, mask)
        return x, self.duration(x, mask)

    def condition(self, enc, durations):
        return regulate(enc, durations, self.position)

    def decode(self, cond):
        x = self.decoder_in(cond)
        for block in self.decoder:
            x = block(x)
        return self.head(self.decoder_norm(x))

    def forward(self, ids, mask, durations):
        enc, log_dur = self.encode(ids, mask)
        return self.decode(self.condition(enc, durations)), log_dur


def losses(out, log_dur, batch) -> dict[str, torch.Tensor]:
    """Frame losses over real frames; F0 over voiced frames only."""
    frames = batch["frame_mask"]
    voiced = batch["f0"] > 40.0
    n = frames.sum().clamp(min=1)
    coef_err = (out[..., 2:] - batch["coefs"].flatten(2)).abs().mean(-1)
    env = (coef_err * frames).sum() / n
    log_f0 = torch.log(batch["f0"].clamp(min=40.0)) - LOG_F0_MEAN
    f0 = ((out[..., 0] - log_f0).abs() * voiced).sum() / voiced.sum().clamp(min=1)
    voicing = (F.binary_cross_entropy_with_logits(out[..., 1], voiced.float(), reduction="none") * frames).sum() / n
    ids = batch["id_mask"]
    dur = (((log_dur - torch.log1p(batch["durations"].float())) ** 2) * ids).sum() / ids.sum()
    return {"env": env, "f0": f0, "voicing": voicing, "dur": dur, "total": env + f0 + 0.2 * voicing + 0.5 * dur}
