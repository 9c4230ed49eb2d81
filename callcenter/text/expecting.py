"""What kind of answer a node waits for: it shapes turn-taking (how long a pause may be) and the
recognizer's grammar. The dialog decides it; the hearing path acts on it."""

from collections.abc import Callable
from enum import StrEnum
from typing import Protocol


class Expecting(StrEnum):
    SPEECH = "speech"
    YES_NO = "yes_no"
    DIGITS = "digits"


class Grammar(Protocol):
    """What the recognizer may know of the node it listens for (the turn detector's `Expectation`
    is one): the kind of answer, and whether a reading answers the node."""

    kind: Expecting
    digits_min: int
    digits_max: int
    answers: Callable[[str], bool] | None
