"""Intent matching from example phrases: the caller's words against each intent's examples.

A bag of normalised word stems, weighted so that content words count and filler does not. It is
deterministic and needs no model; an embedding matcher can replace it behind the same interface.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STOPWORDS = frozenset(
    "a an the i im i'm me my mine we our you your to of for on in at is are am be been was were it "
    "its it's this that with and or but so do does did can could would will please like want need "
    "just about some have has had get got some there here hi hello um uh oh well yes".split()
)
_WORD = re.compile(r"[a-z0-9']+")
MATCH_THRESHOLD = 0.5


def stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def words(text: str) -> list[str]:
    return [stem(w.strip("'")) for w in _WORD.findall(text.lower()) if w.strip("'")]


def content(text: str) -> set[str]:
    ws = words(text)
    kept = {w for w in ws if w not in STOPWORDS}
    return kept or set(ws)


@dataclass
class IntentMatch:
    intent: str | None
    score: float
    runner_up: float


class IntentMatcher:
    def __init__(self, examples: dict[str, list[str]], threshold: float = MATCH_THRESHOLD):
        self.threshold = threshold
        self._examples = {name: [content(e) for e in phrases if e.strip()] for name, phrases in examples.items()}

    def match(self, text: str) -> IntentMatch:
        said = content(text)
        scores: dict[str, float] = {}
        for name, examples in self._examples.items():
            best = 0.0
            for ex in examples:
                if not ex:
                    continue
                overlap = len(said & ex)
                # every example word heard counts fully; extra caller words cost a little
                score = overlap / len(ex) - 0.05 * len(said - ex) / max(1, len(said))
                best = max(best, score)
            scores[name] = best
        ranked = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)
        if not ranked:
            return IntentMatch(None, 0.0, 0.0)
        top_name, top = ranked[0]
        second = ranked[1][1] if len(ranked) > 1 else 0.0
        if top < self.threshold or top - second < 0.1:
            return IntentMatch(None, top, second)
        return IntentMatch(top_name, top, second)


# (cosine to the nearest example of the winning intent, lead over every other intent's best example):
# either very close, or fairly close and far ahead of the rest
EMBED_RULES = ((0.55, 0.04), (0.40, 0.15))


class SemanticMatcher:
    """Words first, meaning second: the word-overlap matcher decides when it is sure; otherwise the
    caller's sentence is compared with every example phrase as sentence embeddings (all-MiniLM-L6-v2)
    and the nearest example wins if it is close enough and clearly nearer than the other intents."""

    def __init__(self, examples: dict[str, list[str]], encoder=None, rules=EMBED_RULES):
        self.words = IntentMatcher(examples)
        self.rules = rules
        self.encoder = encoder
        self._labels = [name for name, phrases in examples.items() for p in phrases if p.strip()]
        self._phrases = [(name, " ".join(words(p))) for name, phrases in examples.items() for p in phrases]
        phrases = [p for ps in examples.values() for p in ps if p.strip()]
        self._vectors = encoder.encode(phrases) if encoder is not None and phrases else None

    def phrase(self, text: str) -> tuple[str, int] | None:
        """The intent one of whose example phrases the caller said word for word ("can I speak to
        the receptionist please" holds "the receptionist"), and that phrase's length in words; the
        longest such phrase wins. None when no example is said whole."""
        said = f" {' '.join(words(text))} "
        best: tuple[str, int] | None = None
        for name, phrase in self._phrases:
            if phrase and f" {phrase} " in said and (best is None or len(phrase.split()) > best[1]):
                best = (name, len(phrase.split()))
        return best

    def ranked(self, text: str) -> list[tuple[str, float]]:
        """Every intent with the cosine of its nearest example phrase to the text, nearest first."""
        if self._vectors is None or not text.strip():
            return []
        sims = self._vectors @ self.encoder.vector(text)
        best: dict[str, float] = {}
        for label, sim in zip(self._labels, sims):
            best[label] = max(best.get(label, -1.0), float(sim))
        return sorted(best.items(), key=lambda kv: kv[1], reverse=True)

    def match(self, text: str) -> IntentMatch:
        by_words = self.words.match(text)
        if by_words.intent is not None or self._vectors is None or not text.strip():
            return by_words
        ranked = self.ranked(text)
        top_name, top = ranked[0]
        second = ranked[1][1] if len(ranked) > 1 else 0.0
        if any(top >= near and top - second >= lead for near, lead in self.rules):
            return IntentMatch(top_name, top, second)
        return IntentMatch(None, max(top, by_words.score), second)
