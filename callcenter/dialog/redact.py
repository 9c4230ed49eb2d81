"""Keeping secrets out of what is stored or sent: card numbers (PCI DSS) and webhook keys.

A call's `Redactor` knows the secret values of that call: the flow's `env:` values (API keys that
webhook URLs and headers carry) and every value the caller gave in a sensitive slot or digit intent.
Everything a call records or sends out (its events JSONL, the console's WebSocket, log lines) passes
through `Redactor.scrub` first. A digit secret is found however it was written: "4111111111111111",
"4111 1111 1111 1111", "4-1-1-1…" or "4 1 1 1 …" (a `{card|digits}` read-back) all become
`************1111`.

While the caller is saying or keying a sensitive value, what they say is not yet known as a value,
so recognised speech is masked as a whole: every digit and number word becomes `*`
(`mask_spoken_digits`), homophones a recognizer writes for them ("for", "won", "ate", "niner",
"nought") included.

Beyond the call's own secrets, `scrub` masks any card number in any text, whatever node the caller
was at (`callcenter.text.pan`): a number volunteered at an earlier question, in words, in other
scripts' digits, with any separator. Only the caller ID and slots the flow declares `sensitive: false`
are exempt.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from callcenter.text.pan import CALLER_ID_KEYS, DIGIT_WORDS, scrub_cards

MASK_CHAR = "*"
KEEP_LAST = 4  # digits of a card number that may be shown (PCI DSS allows the last four)
MIN_SHOWN_LENGTH = 12  # shorter secrets are masked whole
SECRET_MASK = "[redacted]"
MIN_SECRET_CHARS = 4  # env values shorter than this would mask ordinary words: not treated as secrets
_SEPARATORS = r"[\s.,\-/]*"
_NUMBER_WORDS = ("zero|oh|o|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
                 "fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|"
                 "ninety|hundred|thousand|double|triple")
_SPOKEN_DIGITS = re.compile(rf"\d|\b(?:{_NUMBER_WORDS}|{'|'.join(sorted(DIGIT_WORDS, key=len, reverse=True))})\b",
                            re.IGNORECASE)


class Masked(str):
    """A sensitive value as prompts may show it: `************1111`. Spoken plainly it reads
    "ending in 1111"; through `|digits`, "1 1 1 1"."""

    @property
    def last(self) -> str:
        return self.lstrip(MASK_CHAR)


def mask_digits(value: Any) -> Masked:
    """`4111111111111111` → `************1111`; a short value is masked whole."""
    text = str(value)
    digits = re.sub(r"\D", "", text)
    if len(digits) >= MIN_SHOWN_LENGTH:
        return Masked(MASK_CHAR * (len(digits) - KEEP_LAST) + digits[-KEEP_LAST:])
    return Masked(MASK_CHAR * max(len(digits), len(text), 1))


def mask_spoken_digits(text: str) -> str:
    """What a caller said while giving a sensitive value: digits and number words → `*`."""
    return _SPOKEN_DIGITS.sub(MASK_CHAR, text)


class Redactor:
    """The secrets of one call, and the scrubbing of anything that may contain them."""

    def __init__(self, exempt: set[str] | frozenset[str] = frozenset()) -> None:
        self._patterns: list[tuple[re.Pattern, str]] = []
        self._seen: set[str] = set()
        # keys whose values are not scanned for card numbers: the caller ID, and slots the flow
        # declares not sensitive (a long account or phone number)
        self.exempt = frozenset(CALLER_ID_KEYS | set(exempt))

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def add_secret(self, value: Any) -> None:
        """A key or password: replaced by `[redacted]` as written and URL-encoded."""
        text = str(value or "")
        if len(text) < MIN_SECRET_CHARS or text in self._seen:
            return
        self._seen.add(text)
        for form in {text, quote(text, safe=""), quote(text)}:
            self._patterns.append((re.compile(re.escape(form)), SECRET_MASK))

    def add_digits(self, value: Any) -> Masked:
        """A sensitive digit string (a card number): replaced by its mask however it is separated.
        Returns the mask."""
        text = str(value or "")
        digits = re.sub(r"\D", "", text)
        masked = mask_digits(digits)
        if digits and digits not in self._seen:
            self._seen.add(digits)
            pattern = _SEPARATORS.join(re.escape(d) for d in digits)
            self._patterns.append((re.compile(rf"(?<!\d){pattern}(?!\d)"), str(masked)))
        return masked

    def scrub(self, value: Any) -> Any:
        """`value` (text, or dicts and lists of it) with every known secret replaced, and every card
        number masked wherever it stands (but under the exempt keys)."""
        return scrub_cards(self._secrets(value), self.exempt)

    def _secrets(self, value: Any) -> Any:
        if not self._patterns:
            return value
        if isinstance(value, str):
            for pattern, mask in self._patterns:
                value = pattern.sub(mask, value)
            return value
        if isinstance(value, dict):
            return {k: self._secrets(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._secrets(v) for v in value]
        if isinstance(value, int) and not isinstance(value, bool) and len(str(abs(value))) >= MIN_SECRET_CHARS:
            scrubbed = self._secrets(str(value))
            return value if scrubbed == str(value) else scrubbed
        return value
