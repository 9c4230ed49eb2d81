"""Train the SSM voices: teacher audio -> durations -> one multi-voice model -> the committed file.

`callcenter voice train` runs every stage and caches each under the work directory, so a second run
resumes where the first stopped:

1. ``<voice>.npz`` — the training sentences (`corpus.py`) spoken by each voice's teacher;
2. durations for teachers without them, from the framewise aligner (`align.py`);
3. the model, trained with teacher forcing on durations and pitch: multi-resolution STFT loss on the
   waveform, squared error on log durations and on per-phoneme pitch; checkpointed every
   `CHECKPOINT_EVERY` steps (weights, optimiser, step, random state);
4. the export to ``callcenter/voice/weights/ssm-voices.npz``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog
import torch
import torch.nn.functional as F
from torch import nn

from callcenter.studio.voice.model import ModelConfig, VoiceModel, export_voices
from callcenter.voice.spectrum import DELAY, HOP, WIN

log = structlog.get_logger()

CROP_FRAMES = 240
BATCH = 16
PEAK_LR = 2e-3
FINAL_LR = 1e-4
WARMUP = 200
CHECKPOINT_EVERY = 250
STFT_RESOLUTIONS = ((64, 16), (128, 32), (256, 64), (512, 128))


@dataclass
class VoiceSpec:
    name: str
    teacher: str            # piper:joe, flite:awb, ...


def parse_voices(spec: str) -> list[VoiceSpec]:
    """'joe=piper:joe,awb=flite:awb' -> [VoiceSpec('joe', 'piper:joe'), ...]"""
    out = []
    for item in spec.split(","):
        name, _, teacher = item.strip().partition("=")
        if not name or not teacher:
            raise ValueError(f"bad voice spec {item!r}: expected NAME=TEACHER, e.g. joe=piper:joe")
        out.append(VoiceSpec(name, teacher))
    return out


# ---- data ----------------------------------------------------------------------------------------
def prepare_data(voices: list[VoiceSpec], work: Path, sentences: int | None = None) -> dict[str, list[dict]]:
    from callcenter.studio.voice.align import align, train_aligner
    from callcenter.studio.voice.corpus import training_sentences
    from callcenter.studio.voice.teachers import Utterance, build_dataset, load_dataset, save_dataset

    texts = training_sentences()[:sentences]
    data = {}
    for v in voices:
        path = work / f"{v.name}.npz"
        if not path.exists():
            log.info("teacher_speaking", voice=v.name, teacher=v.teacher, sentences=len(texts))
            build_dataset(v.teacher, texts, path)
        data[v.name] = load_dataset(path)
    missing = [n for n, utts in data.items() if utts[0]["durations"] is None]
    if missing:
        timed = [u for utts in data.values() if utts[0]["durations"] is not None for u in utts]
        if not timed:
            raise ValueError("no teacher with durations (piper:joe) to train the aligner from")
        log.info("aligner_training", from_utterances=len(timed))
        net = train_aligner(timed)
        for name in missing:
            align(net, data[name])
        # one round of self-training on every voice, then align the untimed voices again
        net = train_aligner([u for utts in data.values() for u in utts], steps=800, seed=1)
        for name in missing:
            align(net, data[name])
            save_dataset(work / f"{name}.npz", [Utterance(u["text"], list(u["ids"]), u["audio"], u["durations"],
                                                          u["f0"]) for u in data[name]])
    return data


def pitch_targets(utts: list[dict]) -> tuple[float, float]:
    """Set u['pitch'] (per id, normalised log F0, 0 where unvoiced); return the voice's (mean, std)."""
    voiced = np.concatenate([np.log(u["f0"][u["f0"] > 0]) for u in utts])
    mean, std = float(voiced.mean()), float(voiced.std() + 1e-3)
    for u in utts:
        f0 = u["f0"]
        bounds = np.concatenate([[0], np.cumsum(u["durations"])])
        pitch = np.zeros(len(u["ids"]), np.float32)
        for j in range(len(u["ids"])):
            seg = f0[bounds[j]:bounds[j + 1]]
            seg = seg[seg > 0]
            if len(seg):
                pitch[j] = (np.log(seg).mean() - mean) / std
        u["pitch"] = pitch
    return mean, std


# ---- losses --------------------------------------------------------------------------------------
def stft_loss(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Multi-resolution STFT loss: spectral convergence + log-magnitude L1, averaged over resolutions."""
    total = 0.0
    for n_fft, hop in STFT_RESOLUTIONS:
        window = torch.hann_window(n_fft, device=y.device)
        sy = torch.stft(y, n_fft, hop, window=window, return_complex=True).abs().clamp(min=1e-5)
        sx = torch.stft(x, n_fft, hop, window=window, return_complex=True).abs().clamp(min=1e-5)
        sc = torch.linalg.norm(sx - sy) / torch.linalg.norm(sx).clamp(min=1e-5)
        total = total + sc + F.l1_loss(sy.log(), sx.log())
    return total / len(STFT_RESOLUTIONS)


# ---- training ------------------------------------------------------------------------------------
class Batcher:
    def __init__(self, data: dict[str, list[dict]], voices: list[str], seed: int):
        self.items = [(voices.index(name), u) for name, utts in data.items() for u in utts]
        self.rng = np.random.default_rng(seed)

    def next(self, batch: int = BATCH):
        chosen = [self.items[k] for k in self.rng.integers(0, len(self.items), batch)]
        ids = nn.utils.rnn.pad_sequence([torch.tensor(u["ids"]) for _, u in chosen], batch_first=True)
        mask = nn.utils.rnn.pad_sequence([torch.ones(len(u["ids"])) for _, u in chosen], batch_first=True)
        dur = nn.utils.rnn.pad_sequence([torch.tensor(u["durations"]) for _, u in chosen], batch_first=True)
        pitch = nn.utils.rnn.pad_sequence([torch.tensor(u["pitch"]) for _, u in chosen], batch_first=True)
        starts, audio = [], []
        for _, u in chosen:
            frames = int(u["durations"].sum())
            start = int(self.rng.integers(0, max(1, frames - CROP_FRAMES)))
            delayed = np.concatenate([np.zeros(DELAY, np.float32), u["audio"]])
            seg = delayed[start * HOP:(start + CROP_FRAMES) * HOP]
            audio.append(torch.tensor(np.pad(seg, (0, CROP_FRAMES * HOP - len(seg)))))
            starts.append(start)
        voice = torch.tensor([v for v, _ in chosen])
        return ids, voice, mask[..., None], dur, pitch, starts, torch.stack(audio)


def lr_at(step: int, total: int) -> float:
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    progress = min(1.0, (step - WARMUP) / max(1, total - WARMUP))
    return FINAL_LR + 0.5 * (PEAK_LR - FINAL_LR) * (1 + math.cos(math.pi * progress))


def train(voices: list[VoiceSpec], work: Path, steps: int, out: Path, threads: int = 2,
          sentences: int | None = None, seed: int = 0, time_limit_s: float | None = None,
          device: str = "cpu", dim: int | None = None, decoder_layers: int | None = None) -> Path:
    """Train (or resume) and export. On a GPU (`device="cuda"`) a wider/deeper voice may be trained
    with `dim` / `decoder_layers`; the default size is the one that runs in real time on a CPU."""
    torch.set_num_threads(threads)
    work.mkdir(parents=True, exist_ok=True)
    data = prepare_data(voices, work, sentences)
    names = [v.name for v in voices]
    stats = [pitch_targets(data[n]) for n in names]
    torch.manual_seed(seed)
    size = {k: v for k, v in (("dim", dim), ("decoder_layers", decoder_layers)) if v}
    model = VoiceModel(ModelConfig(voices=names, **size))
    model.pitch_stats.copy_(torch.tensor(stats))
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.01)
    ckpt = work / "checkpoint.pt"
    step = 0
    batcher = Batcher(data, names, seed)
    if ckpt.exists():
        blob = torch.load(ckpt, map_location="cpu", weights_only=False)
        if blob["voices"] == names and blob.get("config", model.config.to_dict()) == model.config.to_dict():
            model.load_state_dict(blob["model"])
            opt.load_state_dict(blob["opt"])
            step = blob["step"]
            batcher.rng = blob["rng"]
            log.info("resumed", step=step)
    started = last_log = time.monotonic()
    model.train()
    while step < steps:
        if time_limit_s and time.monotonic() - started > time_limit_s:
            log.info("time_limit_reached", step=step)
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps)
        ids, voice, mask, dur, pitch, starts, target = (
            t.to(device) if isinstance(t, torch.Tensor) else t for t in batcher.next())
        cond, log_dur, pitch_pred = model(ids, voice, mask, dur, pitch)
        cond = F.pad(cond, (0, 0, 0, max(0, max(starts) + CROP_FRAMES - cond.shape[1])))
        crops = torch.stack([cond[b, s:s + CROP_FRAMES] for b, s in enumerate(starts)])
        audio = model.frames_to_audio(model.decode(crops))
        m = mask[..., 0]
        dur_loss = ((log_dur - torch.log1p(dur.float())) ** 2 * m).sum() / m.sum()
        pitch_loss = ((pitch_pred - pitch) ** 2 * m).sum() / m.sum()
        wave_loss = stft_loss(audio[:, WIN:], target[:, WIN:])
        loss = wave_loss + dur_loss + 0.5 * pitch_loss
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 25 == 0:
            log.info("train_step", step=step, wave=round(wave_loss.item(), 4), dur=round(dur_loss.item(), 4),
                     pitch=round(pitch_loss.item(), 4), lr=round(lr_at(step, steps), 6),
                     s_per_step=round((time.monotonic() - last_log) / 25, 2))
            last_log = time.monotonic()
        if step % CHECKPOINT_EVERY == 0:
            _save(ckpt, out, model, opt, step, batcher, voices)
    if step % CHECKPOINT_EVERY:  # the last step (or the time limit) fell between checkpoints
        _save(ckpt, out, model, opt, step, batcher, voices)
    log.info("voices_exported", path=str(out), steps=step)
    return out


def _save(ckpt: Path, out: Path, model, opt, step, batcher, voices: list[VoiceSpec]) -> None:
    """Checkpoint (to resume) and export the voice file (to use), atomically."""
    tmp = ckpt.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "rng": batcher.rng,
                "voices": [v.name for v in voices], "config": model.config.to_dict()}, tmp)
    tmp.replace(ckpt)
    export_voices(out, model, {"steps": step, "teachers": {v.name: v.teacher for v in voices}})
