"""Card numbers (PANs) in free text, in any spelling: the detector in front of everything a call stores
or sends (PCI DSS), whatever node the caller was at.

A PAN is a run of 13–19 digits that passes the Luhn check (or that begins or ends a longer run: a
card number run on into its expiry date). Here a digit is any Unicode decimal digit
("4", "４", "٤"), a number word ("four", "oh", "nought") or a word a recognizer writes for one
("for", "won", "to", "ate", "niner"), and "double"/"triple" repeat the next one. Digits belong to one
run when only separators stand between them: spaces, punctuation of any kind (`-.,:;_+()/` …) and
"and". Every such card number is masked but its last four digits:
a long phone number that happens to pass is masked too, since PCI errs on the side of masking.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

PAN_MIN_DIGITS = 13
PAN_MAX_DIGITS = 19
PAN_KEEP_LAST = 4
PAN_MASK = "*"
# the keys whose values are not free text but a caller ID (a long phone number is not a card)
CALLER_ID_KEYS = frozenset({"caller", "caller_number", "remote", "remote_uri", "from", "to"})

DIGIT_WORDS = {
    "zero": "0", "oh": "0", "o": "0", "nought": "0", "naught": "0", "nil": "0",
    "one": "1", "won": "1",
    "two": "2", "to": "2", "too": "2",
    "three": "3", "tree": "3",
    "four": "4", "for": "4", "fore": "4",
    "five": "5", "fife": "5",
    "six": "6",
    "seven": "7",
    "eight": "8", "ate": "8",
    "nine": "9", "niner": "9",
}
REPEATS = {"double": 2, "triple": 3}
SEPARATOR_WORDS = frozenset({"and"})
_TOKEN = re.compile(r"[^\W_]+|[^\w\s]|_", re.UNICODE)


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _digit_tokens(text: str) -> list[tuple[str, int, int]]:
    """(digits, start, end) for each token that stands for digits; a separator gives ("", s, e) and
    anything else ("x", s, e), which breaks a run."""
    out: list[tuple[str, int, int]] = []
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        low = tok.lower()
        if all(unicodedata.decimal(c, None) is not None for c in tok):
            out.append(("".join(str(unicodedata.decimal(c)) for c in tok), m.start(), m.end()))
        elif low in DIGIT_WORDS:
            out.append((DIGIT_WORDS[low], m.start(), m.end()))
        elif low in REPEATS or low in SEPARATOR_WORDS or not tok[0].isalnum():
            out.append(("" if low not in REPEATS else f"x{REPEATS[low]}", m.start(), m.end()))
        else:
            out.append(("?", m.start(), m.end()))
    return out


def _runs(text: str) -> list[list[tuple[str, int, int]]]:
    """Runs of single digits with their spans: [(digit, start, end), ...]."""
    runs, run, repeat = [], [], 1
    for value, start, end in _digit_tokens(text):
        if value == "?":
            if run:
                runs.append(run)
            run, repeat = [], 1
        elif value.startswith("x"):
            repeat = int(value[1:])
        elif value:
            for i, d in enumerate(value):  # a token of digits: each digit its own character
                span = (start + i, start + i + 1) if len(value) == end - start else (start, end)
                for _ in range(repeat if i == 0 else 1):
                    run.append((d, *span))
            repeat = 1
    if run:
        runs.append(run)
    return runs


def card_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, digits) of every card-number window in `text`; spans of the digits to mask."""
    found = []
    for run in _runs(text):
        digits = "".join(d for d, _, _ in run)
        hidden = [False] * len(run)
        for n in range(PAN_MIN_DIGITS, min(PAN_MAX_DIGITS, len(digits)) + 1):
            # a card number starts or ends the run (one run on, or run into, an expiry date or a
            # code: "4111 1111 1111 1111 12 27"); a run longer than any card is searched throughout
            starts = range(len(digits) - n + 1) if len(digits) > PAN_MAX_DIGITS else {0, len(digits) - n}
            for i in starts:
                if luhn_ok(digits[i:i + n]):
                    for j in range(i, i + n - PAN_KEEP_LAST):
                        hidden[j] = True
        for (d, start, end), hide in zip(run, hidden):
            if hide:
                found.append((start, end, d))
    return found


def mask_cards(text: str) -> str:
    """`text` with the digits of every card number in it masked (`*`) but the last four."""
    if not isinstance(text, str) or sum(c.isdigit() or c.isalpha() for c in text) < PAN_MIN_DIGITS:
        return text
    spans = sorted({(s, e) for s, e, _ in card_spans(text)})
    if not spans:
        return text
    out, last = [], 0
    for start, end in spans:
        if start < last:
            continue
        out.append(text[last:start])
        out.append(PAN_MASK)  # a digit, or a whole number word
        last = end
    out.append(text[last:])
    return "".join(out)


def scrub_cards(value: Any, exempt: frozenset[str] | set[str] = CALLER_ID_KEYS) -> Any:
    """`value` (text, or dicts and lists of it) with every card number masked; the values of keys in
    `exempt` (the caller ID, slots declared not sensitive) are left as they are."""
    if isinstance(value, str):
        return mask_cards(value)
    if isinstance(value, dict):
        return {k: v if k in exempt else scrub_cards(v, exempt) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_cards(v, exempt) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and len(str(abs(value))) >= PAN_MIN_DIGITS:
        masked = mask_cards(str(value))
        return value if masked == str(value) else masked
    return value
