"""What kind of answer a node waits for: it shapes turn-taking (how long a pause may be) and the
recognizer's hint. The dialog decides it; the hearing path acts on it."""

from enum import StrEnum


class Expecting(StrEnum):
    SPEECH = "speech"
    YES_NO = "yes_no"
    DIGITS = "digits"
