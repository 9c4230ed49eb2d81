"""Digit strings as callers say them: "four seven two, nine one eight", "double five", "oh",
"472-918", "forty seven". Turns a transcript into the digits the caller meant, deterministically."""

from __future__ import annotations

import re

UNITS = {"zero": 0, "oh": 0, "o": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
         "seven": 7, "eight": 8, "nine": 9}
TEENS = {"ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
         "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19}
TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
        "ninety": 90}
REPEATS = {"double": 2, "triple": 3}
HOMOPHONES = {"for": 4, "fore": 4, "to": 2, "too": 2, "ate": 8, "won": 1, "free": 3, "tree": 3}  # inside a run
FILLER = {"and", "dash", "uh", "um", "er", "hmm", "hyphen", "space"}   # may sit inside a digit string
_TOKEN = re.compile(r"[a-z]+|\d+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower().replace("-", " "))


def _digitlike(tok: str) -> bool:
    return tok.isdigit() or tok in UNITS or tok in TEENS or tok in TENS or tok in REPEATS


def digit_runs(text: str) -> list[str]:
    """Every run of digits in `text`, spoken or written, in order. Fillers ("and", "uh", dashes,
    commas) do not break a run; any other word does."""
    runs: list[str] = []
    current: list[str] = []
    tokens = _tokens(text)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if tok.isdigit():
            current.append(tok)
        elif tok in UNITS and not (tok == "o" and not current and nxt not in UNITS and not nxt.isdigit()):
            current.append(str(UNITS[tok]))
        elif tok in TEENS:
            current.append(str(TEENS[tok]))
        elif tok in TENS:
            if nxt in UNITS and UNITS[nxt] > 0:
                current.append(str(TENS[tok] + UNITS[nxt]))
                i += 1
            else:
                current.append(str(TENS[tok]))
        elif tok in REPEATS and (nxt in UNITS or nxt.isdigit() and len(nxt) == 1):
            current.append((str(UNITS[nxt]) if nxt in UNITS else nxt) * REPEATS[tok])
            i += 1
        elif tok in HOMOPHONES and current and (_digitlike(nxt) or not nxt):
            current.append(str(HOMOPHONES[tok]))
        elif tok in FILLER and current:
            pass
        elif current:
            runs.append("".join(current))
            current = []
        i += 1
    if current:
        runs.append("".join(current))
    return runs


def spoken_digits(text: str) -> str:
    """The digit string in `text`: all of its runs joined ("my number is 472, 9183" -> "4729183")."""
    return "".join(digit_runs(text))


def digits_hint(length: int) -> str:
    """A previous-text prompt that makes Whisper write spoken digits as digits."""
    sample = "4729183650417" * 3
    return f"My number is {sample[:max(1, length)]}."
