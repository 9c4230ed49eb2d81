"""Word error rate with the text normalization both sides need (numbers read out, no punctuation)."""

from __future__ import annotations

from callcenter.voice.text import edit_distance, words

__all__ = ["edit_distance", "words", "wer"]


def wer(pairs: list[tuple[str, str]]) -> float:
    """Corpus WER over (reference, hypothesis) pairs: total edits / total reference words."""
    errors = sum(edit_distance(words(r), words(h)) for r, h in pairs)
    total = sum(len(words(r)) for r, _ in pairs)
    return errors / max(1, total)
