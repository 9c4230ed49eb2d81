"""Phone numbers as operators write them in a dial, a contact list or a do-not-call list:
`+1 415-555-0100` is `+14155550100`. Spaces and dashes are dropped; what remains must be an
optional `+` and 3 to 20 digits."""

from __future__ import annotations

import re

PHONE_NUMBER = re.compile(r"^\+?[0-9]{3,20}$")


def phone_number(text: str) -> str | None:
    """The number `text` names, without spaces or dashes; None if it is not a phone number."""
    number = text.strip().replace(" ", "").replace("-", "")
    return number if PHONE_NUMBER.fullmatch(number) else None
