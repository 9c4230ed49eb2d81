"""`callcenter bench stt`: recognition on bad phone lines, measured on `../shared/eval/`.

For every condition of the evaluation set (clean, µ-law, white and babble noise at 20/10/5 dB) and
for each front end — the raw line, and the streaming noise gate (`denoise.py`) in front — it reports:

- WER of the embedded STT over the condition's utterances;
- VAD false alarms: the share of 32 ms windows silero calls speech in the known non-speech lead-in
  and tail of each file, and the share of speech windows it finds in the middle;
- the noise gate's cost per 20 ms frame, and STT decode time per utterance.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import structlog

from callcenter.audio.frames import SAMPLE_RATE, frames_from_pcm
from callcenter.audio.wavfile import read_wav
from callcenter.hearing.denoise import Denoiser
from callcenter.hearing.vad import VAD_WINDOW_SAMPLES, SileroVad
from callcenter.hearing.wer import wer

log = structlog.get_logger()

EVAL_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "eval"
LEAD_S, TAIL_S = 0.3, 0.5          # the eval files' silence before and after the speech
VAD_THRESHOLD = 0.5


def load_manifest(eval_dir: Path = EVAL_DIR) -> list[dict]:
    path = eval_dir / "manifest.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the evaluation set is missing")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _front_end(pcm: bytes, denoise: bool) -> tuple[bytes, float]:
    """Audio as the recognizer gets it (time-aligned with the input) and the gate's ms per frame."""
    if not denoise:
        return pcm, 0.0
    gate = Denoiser()
    frames = list(frames_from_pcm(pcm)) + list(frames_from_pcm(bytes(int(gate.LATENCY_MS * 16) + 320)))
    started = time.perf_counter()
    out = b"".join(gate.process(f).pcm for f in frames)
    cost = (time.perf_counter() - started) * 1000 / len(frames)
    skip = int(gate.LATENCY_MS * SAMPLE_RATE / 1000) * 2
    return out[skip:skip + len(pcm)], cost


def _vad_rates(pcm: bytes) -> tuple[int, int, int, int]:
    vad = SileroVad()
    probs = np.array(vad.feed(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768))
    centre = (np.arange(len(probs)) + 0.5) * VAD_WINDOW_SAMPLES / SAMPLE_RATE
    dur = len(pcm) / 2 / SAMPLE_RATE
    quiet = (centre < LEAD_S - 0.05) | (centre > dur - TAIL_S + 0.05)
    speech = (centre > LEAD_S + 0.2) & (centre < dur - TAIL_S - 0.2)
    fired = probs > VAD_THRESHOLD
    return int((fired & quiet).sum()), int(quiet.sum()), int((fired & speech).sum()), int(speech.sum())


def run_stt_bench(out: Path, limit: int | None = None, stt_model: str | None = None,
                  eval_dir: Path = EVAL_DIR) -> dict:
    from callcenter.hearing.stt import WhisperStt

    stt = WhisperStt(stt_model)
    items = load_manifest(eval_dir)
    by_cond: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_cond[item["cond"]].append(item)
    report: dict = {"eval_dir": str(eval_dir), "conditions": {}}
    for cond, entries in by_cond.items():
        entries = entries[:limit] if limit else entries
        report["conditions"][cond] = {}
        for denoise in (False, True):
            pairs, costs, decode = [], [], []
            fa = [0, 0, 0, 0]
            for e in entries:
                audio, cost = _front_end(read_wav(eval_dir / e["path"]), denoise)
                costs.append(cost)
                result = stt.transcribe_pcm(audio)
                decode.append(result.seconds)
                pairs.append((e["text"], result.text))
                fa = [a + b for a, b in zip(fa, _vad_rates(audio))]
            row = {
                "utterances": len(entries),
                "wer": round(wer(pairs), 4),
                "vad_false_alarm": round(fa[0] / max(1, fa[1]), 4),
                "vad_speech_found": round(fa[2] / max(1, fa[3]), 4),
                "stt_decode_s_p50": round(float(np.median(decode)), 3),
            }
            if denoise:
                row["denoise_ms_per_frame_p50"] = round(float(np.median(costs)), 3)
            report["conditions"][cond]["denoised" if denoise else "raw"] = row
            log.info("stt_bench", cond=cond, denoise=denoise, **row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return report
