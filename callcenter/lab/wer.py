"""Word error rate with the text normalization both sides need (numbers read out, no punctuation)."""

from __future__ import annotations

import re

from callcenter.voice.text import normalize


def words(text: str) -> list[str]:
    """Lower-case words of `text` as spoken: '$12.50, please!' -> ['twelve', 'dollars', ...]."""
    text = normalize(text).lower().replace("-", " ")
    return re.sub(r"[^a-z' ]", " ", text).replace("'", "").split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(pairs: list[tuple[str, str]]) -> float:
    """Corpus WER over (reference, hypothesis) pairs: total edits / total reference words."""
    errors = sum(edit_distance(words(r), words(h)) for r, h in pairs)
    total = sum(len(words(r)) for r, _ in pairs)
    return errors / max(1, total)
