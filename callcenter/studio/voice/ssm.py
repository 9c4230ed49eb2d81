"""Causal gated state-space blocks (diagonal S4D), in two forms that compute the same function.

Training runs the parallel form here (torch): the SSM's impulse response is materialised as a kernel
and applied to the whole sequence with an FFT convolution. Synthesis runs the recurrent form
(`runtime.py`, numpy): one acoustic frame at a time from a running state, so every step costs the
same however long the utterance already is. `tests/test_voice.py` checks that both forms agree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from callcenter.voice.spectrum import CONV_TAPS

DT_MIN, DT_MAX = 0.01, 0.5


class S4D(nn.Module):
    """Diagonal SSM per channel: h' = A h + B u, y = 2 Re(C h) + D u, discretised with zero-order hold."""

    def __init__(self, channels: int, state: int = 32):
        super().__init__()
        log_dt = torch.rand(channels) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)
        self.log_dt = nn.Parameter(log_dt)
        self.log_a_real = nn.Parameter(torch.log(0.5 * torch.ones(channels, state)))
        self.a_imag = nn.Parameter(math.pi * torch.arange(state).float().repeat(channels, 1))
        self.c = nn.Parameter(torch.randn(channels, state, 2) * (0.5 ** 0.5))
        self.d = nn.Parameter(torch.ones(channels))

    def _discrete(self):
        dt = self.log_dt.exp()[:, None]
        a = torch.complex(-self.log_a_real.exp(), self.a_imag)
        dta = a * dt
        a_bar = dta.exp()
        b_bar = (a_bar - 1) / a
        c = torch.view_as_complex(self.c)
        return dta, a_bar, c * b_bar

    def kernel(self, length: int) -> torch.Tensor:
        """2 Re(sum_n CB_n A_n^l), l < length: (H, L). A^l = exp(dta l) is taken as its decay and
        its angle, in real exp, cos and sin, which torch vectorises where its complex exp does not
        (that exp was 40 % of a clone's time; the kernel agrees to float rounding, 3e-7)."""
        dta, _, cb = self._discrete()
        steps = torch.arange(length, device=dta.device, dtype=dta.real.dtype)
        decay = torch.exp(dta.real[..., None] * steps)
        angle = dta.imag[..., None] * steps
        return 2 * (torch.einsum("hn,hnl->hl", cb.real, decay * torch.cos(angle))
                    - torch.einsum("hn,hnl->hl", cb.imag, decay * torch.sin(angle)))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u: (B, H, L) -> (B, H, L), causal."""
        length = u.shape[-1]
        k = self.kernel(length)
        n = 2 * length
        y = torch.fft.irfft(torch.fft.rfft(u, n) * torch.fft.rfft(k, n), n)[..., :length]
        return y + u * self.d[:, None]

    def discrete(self):
        """(A_bar, C * B_bar) for the recurrent form, each (H, N) complex."""
        _, a_bar, cb = self._discrete()
        return a_bar, cb


class GatedSsmBlock(nn.Module):
    """x + out(S4D(silu(conv(u))) * silu(g)) with (u, g) = in(norm x), widened `expand` times inside."""

    def __init__(self, dim: int, state: int = 32, expand: int = 2):
        super().__init__()
        inner = expand * dim
        self.norm = nn.LayerNorm(dim)
        self.in_proj = nn.Linear(dim, 2 * inner)
        self.conv = nn.Conv1d(inner, inner, CONV_TAPS, groups=inner)
        self.ssm = S4D(inner, state)
        self.out_proj = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, D)."""
        u, g = self.in_proj(self.norm(x)).chunk(2, dim=-1)
        u = F.pad(u.transpose(1, 2), (CONV_TAPS - 1, 0))
        u = F.silu(self.conv(u))
        y = self.ssm(u).transpose(1, 2)
        return x + self.out_proj(y * F.silu(g))
