"""Word error rate, two ways.

- `wer`: this project's normalization (`voice.text.words`: numbers read out as words, no
  punctuation), as every figure in the README before 2026-12-05 was measured. A digit string
  counts one word per digit.
- `whisper_wer`: Whisper's English normalizer on both sides (`EnglishTextNormalizer`, from pip
  `whisper-normalizer`, MIT, a copy of openai-whisper's), the measure the issues' targets and
  `../shared/README.md` use: numbers become digits ("nine thirty" → "930", "twelve dollars and
  fifty cents" → "$12.50"), contractions are expanded, British spellings made American, fillers
  dropped. A digit string is one word there.
"""

from __future__ import annotations

import functools

from callcenter.voice.text import edit_distance, words

__all__ = ["edit_distance", "words", "wer", "whisper_words", "whisper_wer"]


def wer(pairs: list[tuple[str, str]]) -> float:
    """Corpus WER over (reference, hypothesis) pairs: total edits / total reference words."""
    return _corpus(pairs, words)


@functools.cache
def _whisper_normalizer():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def whisper_words(text: str) -> list[str]:
    """`text` as Whisper's English normalizer leaves it, split into words."""
    return _whisper_normalizer()(text).split()


def whisper_wer(pairs: list[tuple[str, str]]) -> float | None:
    """Corpus WER with Whisper's English normalizer on both sides; None where the normalizer is not
    installed (it comes with the test extra)."""
    try:
        _whisper_normalizer()
    except ImportError:
        return None
    return _corpus(pairs, whisper_words)


def _corpus(pairs, split) -> float:
    errors = sum(edit_distance(split(r), split(h)) for r, h in pairs)
    total = sum(len(split(r)) for r, _ in pairs)
    return errors / max(1, total)
