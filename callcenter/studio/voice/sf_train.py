"""Train the source-filter SSM voice from hibari-tts (CPU, resumable).

    python -m callcenter.studio.voice.sf_train --work build/sf --minutes 45

builds the teacher's dataset once (`build/sf/teacher-v2.npz`, ~20 ms a sentence), then trains with
checkpoints every 200 steps (`build/sf/ckpt.pt`, resumed when present) until the step count or the
time budget runs out, and exports `build/sf/voice.pt` (the weights for export). `--init FILE` goes on
from a voice file instead of from scratch (peak learning rate `FINE_TUNE_LR`), and the exported file
keeps the stages before it in its `history`.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import torch

from callcenter.studio.voice.sf_model import SfConfig, SfVoiceModel, losses

BATCH = 16
LR = 2e-3
CKPT_EVERY = 200
WINDOW = 96  # frames (1.2 s) of each utterance per step
CONVERSATION_LINES = 1500  # corpus.conversation_lines beside the agent lines and prose
# the teacher's frames for the corpus; named for what it holds: v2 reads the text as calls do and
# adds the conversation lines (a work folder's older teacher.npz is not reused)
TEACHER_DATA = "teacher-v2.npz"
CORPUS = "v2: agent lines, prose and conversation lines, read as calls read them"
FINE_TUNE_LR = 5e-4  # the peak learning rate when going on from a voice file (`--init`)


def batches(data: list[dict], rng: random.Random, size: int = BATCH):
    while True:
        items = [data[rng.randrange(len(data))] for _ in range(size)]
        ids_len = max(len(x["ids"]) for x in items)
        frames = max(len(x["f0"]) for x in items)
        b = {"ids": torch.zeros(size, ids_len, dtype=torch.long), "id_mask": torch.zeros(size, ids_len),
             "durations": torch.zeros(size, ids_len, dtype=torch.long), "f0": torch.zeros(size, frames),
             "coefs": torch.zeros(size, frames, 3, items[0]["coefs"].shape[-1]), "frame_mask": torch.zeros(size, frames)}
        for i, x in enumerate(items):
            n, f = len(x["ids"]), len(x["f0"])
            b["ids"][i, :n] = torch.from_numpy(x["ids"])
            b["id_mask"][i, :n] = 1
            b["durations"][i, :n] = torch.from_numpy(x["durations"])
            b["f0"][i, :f] = torch.from_numpy(x["f0"])
            b["coefs"][i, :f] = torch.from_numpy(x["coefs"])
            b["frame_mask"][i, :f] = 1
        yield b


def crop(cond: torch.Tensor, b: dict, rng: random.Random, window: int = WINDOW) -> tuple[torch.Tensor, dict]:
    """A random window of each utterance's frames (the decoder is causal: it learns to speak from a
    zero state anywhere, and costs a third of whole utterances)."""
    lengths = b["frame_mask"].sum(1).long().tolist()
    starts = [rng.randrange(0, max(1, n - window + 1)) for n in lengths]
    width = min(window, cond.shape[1])

    def take(x):
        return torch.stack([x[i, s:s + width] if x.shape[1] >= s + width else
                            torch.nn.functional.pad(x[i, s:], (0, 0) * (x.dim() - 2) + (0, s + width - x.shape[1]))
                            for i, s in enumerate(starts)])

    out = dict(b)
    for k in ("f0", "coefs", "frame_mask"):
        out[k] = take(b[k])
    return take(cond), out


def from_voice_file(path: Path) -> SfVoiceModel:
    """A model with a voice file's weights (`export_sf_voice`: half precision back to single), to
    train on from there."""
    import json

    import numpy as np

    blob = np.load(path)
    meta = json.loads(str(blob["__meta__"]))
    model = SfVoiceModel(SfConfig(**meta["config"]))
    model.load_state_dict({k: torch.from_numpy(blob[k].astype(np.float32)) for k in blob.files if k != "__meta__"})
    return model


def train(work: Path, steps: int, minutes: float, threads: int = 2, sentences: int = 2500,
          conversation: int = CONVERSATION_LINES, init: Path | None = None, lr_peak: float | None = None) -> Path:
    """Train (or, with `init`, go on training a voice file) until `steps` or `minutes` run out; the
    peak learning rate is `LR` from scratch, `FINE_TUNE_LR` from a voice file, unless given."""
    from callcenter.studio.voice.corpus import training_sentences
    from callcenter.studio.voice.hibari_teacher import build_dataset, load_dataset

    torch.set_num_threads(threads)
    work.mkdir(parents=True, exist_ok=True)
    data_path = work / TEACHER_DATA
    if not data_path.exists():
        build_dataset(training_sentences(agent=sentences, seed=0, conversation=conversation), data_path)
    data = load_dataset(data_path)
    model = from_voice_file(init) if init else SfVoiceModel(SfConfig())
    lr_peak = lr_peak or (FINE_TUNE_LR if init else LR)
    opt = torch.optim.AdamW(model.parameters(), lr=lr_peak, weight_decay=0.01)
    ckpt, step = work / "ckpt.pt", 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    rng = random.Random(step)
    stream = batches(data, rng)
    deadline = time.monotonic() + minutes * 60
    log_every, acc, t0 = 50, {}, time.monotonic()
    warmup = min(300, max(1, steps // 10))
    while step < steps and time.monotonic() < deadline:
        lr = lr_peak * min(1.0, (step + 1) / warmup) * (0.5 * (1 + math.cos(math.pi * min(step, steps) / steps)) * 0.95 + 0.05)
        for g in opt.param_groups:
            g["lr"] = lr
        b = next(stream)
        enc, log_dur = model.encode(b["ids"], b["id_mask"][..., None])
        cond, b = crop(model.condition(enc, b["durations"]), b, rng)
        parts = losses(model.decode(cond), log_dur, b)
        opt.zero_grad()
        parts["total"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        for k, v in parts.items():
            acc[k] = acc.get(k, 0.0) + float(v.detach())
        if step % log_every == 0:
            print(f"step {step} lr {lr:.2e} " + " ".join(f"{k} {v / log_every:.4f}" for k, v in acc.items())
                  + f" {(time.monotonic() - t0) / log_every:.2f} s/step", flush=True)
            acc, t0 = {}, time.monotonic()
        if step % CKPT_EVERY == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "config": model.config.to_dict()}, ckpt)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "config": model.config.to_dict()}, ckpt)
    return ckpt


def export(ckpt: Path, out: Path, history: list[dict] | None = None) -> Path:
    """A checkpoint as the committed voice file (`sf_runtime.SfVoice` reads it); `history`: the
    training stages before this one (a voice file trained on from another)."""
    from callcenter.voice.sf_runtime import export_sf_voice

    state = torch.load(ckpt, weights_only=False)
    model = SfVoiceModel(SfConfig(**state["config"]))
    model.load_state_dict(state["model"])
    export_sf_voice(out, model, {"teacher": "hibari-tts af_heart (Apache-2.0)", "steps": state["step"],
                                 "corpus": CORPUS, **({"history": history} if history else {})})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="build/sf")
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--minutes", type=float, default=45)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--export", default=None, help="write the voice file here when done")
    p.add_argument("--init", default=None, help="go on training from this voice file")
    p.add_argument("--lr", type=float, default=None)
    args = p.parse_args()
    init = Path(args.init) if args.init else None
    ckpt = train(Path(args.work), args.steps, args.minutes, args.threads, init=init, lr_peak=args.lr)
    print(export(ckpt, Path(args.export), init_history(init)) if args.export else ckpt)


def init_history(init: Path | None) -> list[dict] | None:
    """The stages a voice file went through, for the file trained on from it."""
    if init is None:
        return None
    import json

    import numpy as np

    meta = json.loads(str(np.load(init)["__meta__"]))
    return [*meta.get("history", []), {k: meta[k] for k in ("steps", "corpus") if k in meta}]


if __name__ == "__main__":
    main()
