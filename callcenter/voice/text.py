"""Text front end: what a phone agent would say for the characters a flow author typed.

Numbers become words the way a phone agent reads them — amounts as amounts ("twelve dollars and
fifty cents"), times as times ("nine thirty a m"), ISO dates as dates ("December second, twenty
twenty six"), and long digit strings (account, phone and card numbers) digit by digit in groups
("four seven two, nine one eight"). Prompts may carry two pieces of markup:

- ``[pause]`` or ``[pause 500ms]`` — a silence of that length (default 300 ms, at most 5 s);
- ``[digits 472918]`` — read the digits one by one in groups of three, whatever their length.

`speech_chunks(text)` splits a prompt into sentences and pauses, the units the voice streams.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PAUSE_MS = 300
MAX_PAUSE_MS = 5000
SPELL_MIN_DIGITS = 5          # a bare number this long is read digit by digit
DIGIT_GROUP = 3

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
        "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
ORDINAL_WORDS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                 "nine": "ninth", "twelve": "twelfth"}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "£": ("pound", "pounds", "penny", "pence"),
              "€": ("euro", "euros", "cent", "cents")}

PAUSE_RE = re.compile(r"\[pause(?:\s+(\d+)\s*(ms|s)?)?\]", re.I)
DIGITS_MARK_RE = re.compile(r"\[digits\s+([\d\s-]+)\]", re.I)
CURRENCY_RE = re.compile(r"([$£€])\s?(\d{1,3}(?:,\d{3})*|\d+)(?:\.(\d{2}))?\b")
TIME_RE = re.compile(r"\b(\d{1,2}):(\d{2})(?:\s*(am|pm|a\.m\.|p\.m\.)(?!\w))?", re.I)
ISO_DATE_RE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
MONTH_DAY_RE = re.compile(r"\b(" + "|".join(MONTHS) + r")\s+(\d{1,2})(?:st|nd|rd|th)?\b")
ORDINAL_RE = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.I)
PERCENT_RE = re.compile(r"\b(\d+(?:\.\d+)?)\s?%")
GROUPED_DIGITS_RE = re.compile(r"\b\d+(?:[ -]\d+)+\b")
DECIMAL_RE = re.compile(r"\b(\d+)\.(\d+)\b")
NUMBER_RE = re.compile(r"\b\d+(?:,\d{3})*\b")
SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+")
ABBREVIATIONS = {"Mr.": "Mister", "Mrs.": "Missus", "Dr.": "Doctor", "approx.": "approximately",
                 "e.g.": "for example", "i.e.": "that is", "etc.": "et cetera"}


@dataclass(frozen=True)
class Chunk:
    """One unit the voice speaks: a sentence of normalized words, or a pause."""
    text: str = ""
    pause_ms: int = 0


def cardinal(n: int) -> str:
    """0..999,999,999,999 in words: 342 -> 'three hundred forty two'."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + cardinal(rest))
    for size, name in ((10**9, "billion"), (10**6, "million"), (1000, "thousand")):
        if n >= size:
            rest = n % size
            return cardinal(n // size) + " " + name + ("" if rest == 0 else " " + cardinal(rest))
    raise ValueError(n)


def ordinal(n: int) -> str:
    words = cardinal(n).split()
    last = words[-1]
    if last in ORDINAL_WORDS:
        words[-1] = ORDINAL_WORDS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def year(n: int) -> str:
    """1999 -> 'nineteen ninety nine', 2026 -> 'twenty twenty six', 2005 -> 'two thousand five'."""
    if 2000 <= n < 2010:
        return cardinal(n)
    high, low = divmod(n, 100)
    if low == 0:
        return cardinal(high) + " hundred"
    return cardinal(high) + " " + (f"oh {ONES[low]}" if low < 10 else cardinal(low))


def spell_digits(digits: str, groups: list[int] | None = None) -> str:
    """'472918' -> 'four seven two, nine one eight': the way an agent reads a number back."""
    digits = re.sub(r"\D", "", digits)
    if groups is None:
        groups = _default_groups(len(digits))
    parts, at = [], 0
    for size in groups:
        if at >= len(digits):
            break
        parts.append(" ".join(ONES[int(d)] for d in digits[at:at + size]))
        at += size
    return ", ".join(parts)


def _default_groups(length: int) -> list[int]:
    if length <= 4:
        return [length]                        # a PIN or short code: one breath
    if length == 10:
        return [3, 3, 4]                       # a North American phone number
    if length == 16:
        return [4, 4, 4, 4]                    # a payment card
    groups = [DIGIT_GROUP] * (length // DIGIT_GROUP)
    rest = length % DIGIT_GROUP
    if rest == 1 and groups:                   # never leave one digit alone: ...3, 2, 2
        groups[-1:] = [2, 2]
    elif rest:
        groups.append(rest)
    return groups


def _time(m: re.Match) -> str:
    hour, minute, suffix = int(m.group(1)), int(m.group(2)), (m.group(3) or "").lower().replace(".", "")
    if hour > 23 or minute > 59:
        return m.group(0)
    if not suffix and hour > 12:
        hour, suffix = hour - 12, "pm"
    elif not suffix and hour == 0:
        hour, suffix = 12, "am"
    words = cardinal(hour)
    if minute == 0:
        words += "" if suffix else " o'clock"
    elif minute < 10:
        words += f" oh {ONES[minute]}"
    else:
        words += " " + cardinal(minute)
    if suffix:
        words += " a m" if suffix == "am" else " p m"
    return words


def _currency(m: re.Match) -> str:
    one, many, sub_one, sub_many = CURRENCIES[m.group(1)]
    whole = int(m.group(2).replace(",", ""))
    cents = int(m.group(3)) if m.group(3) else 0
    words = f"{cardinal(whole)} {one if whole == 1 else many}"
    if cents:
        words += f" and {cardinal(cents)} {sub_one if cents == 1 else sub_many}"
    return words


def _iso_date(m: re.Match) -> str:
    y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return spell_digits(m.group(0))
    return f"{MONTHS[mo - 1]} {ordinal(d)}, {year(y)}"


def _number(m: re.Match) -> str:
    return number_words(m.group(0))


def number_words(raw: str) -> str:
    """A number as written ('1,250', '2026', '04721') in words."""
    digits = raw.replace(",", "")
    if "," not in raw and (len(digits) >= SPELL_MIN_DIGITS or (len(digits) > 1 and digits[0] == "0")):
        return spell_digits(digits)
    if len(digits) == 4 and 1900 <= int(digits) <= 2099 and "," not in raw:
        return year(int(digits))
    return cardinal(int(digits))


def _decimal(m: re.Match) -> str:
    return f"{number_words(m.group(1))} point {' '.join(ONES[int(d)] for d in m.group(2))}"


def normalize(text: str) -> str:
    """Words only, as spoken: 'Pay $12.50 by 9:30pm' -> 'Pay twelve dollars and fifty cents by nine thirty p m'."""
    for short, full in ABBREVIATIONS.items():
        text = text.replace(short, full)
    text = DIGITS_MARK_RE.sub(lambda m: spell_digits(m.group(1)), text)
    text = CURRENCY_RE.sub(_currency, text)
    text = ISO_DATE_RE.sub(_iso_date, text)
    text = TIME_RE.sub(_time, text)
    text = MONTH_DAY_RE.sub(lambda m: f"{m.group(1)} {ordinal(int(m.group(2)))}", text)
    text = ORDINAL_RE.sub(lambda m: ordinal(int(m.group(1))), text)
    text = PERCENT_RE.sub(lambda m: (_decimal(DECIMAL_RE.match(m.group(1))) if "." in m.group(1)
                                     else number_words(m.group(1))) + " percent", text)
    text = GROUPED_DIGITS_RE.sub(lambda m: ", ".join(spell_digits(g, [len(g)]) for g in re.split(r"[ -]", m.group(0))), text)
    text = DECIMAL_RE.sub(_decimal, text)
    text = NUMBER_RE.sub(_number, text)
    text = text.replace("&", " and ").replace("@", " at ").replace("#", " number ")
    return re.sub(r"\s+", " ", text).strip()


def speech_chunks(text: str) -> list[Chunk]:
    """A prompt as the voice speaks it: normalized sentences and the pauses between them."""
    chunks: list[Chunk] = []
    at = 0
    for m in PAUSE_RE.finditer(text):
        chunks.extend(_sentences(text[at:m.start()]))
        value = int(m.group(1)) if m.group(1) else DEFAULT_PAUSE_MS
        if (m.group(2) or "ms").lower() == "s":
            value *= 1000
        chunks.append(Chunk(pause_ms=min(value, MAX_PAUSE_MS)))
        at = m.end()
    chunks.extend(_sentences(text[at:]))
    return chunks


def _sentences(text: str) -> list[Chunk]:
    text = normalize(text)
    return [Chunk(text=s.strip()) for s in SENTENCE_END_RE.split(text) if re.search(r"\w", s)]


def split_ready_sentences(buffer: str) -> tuple[list[str], str]:
    """For streamed text (an LLM's tokens): the complete sentences in `buffer`, and the rest."""
    parts = SENTENCE_END_RE.split(buffer)
    if len(parts) == 1:
        return [], buffer
    return [p for p in parts[:-1] if p.strip()], parts[-1]


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
