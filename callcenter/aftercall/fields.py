"""A flow's own `after_call:` fields and phrase categories, filled by rules when its call is over:
a variable's final value (`from`), a condition over the variables and the outcome (`when`), or the
caller's phrases (`phrases`, and each phrase category). What the caller said is read from the
events' `stt_final` texts, which are masked already; sensitive variables never get here (the
checker refuses them in `from`, and the call leaves them out)."""

from __future__ import annotations

import re
from typing import Any

from callcenter.call import events as ev
from callcenter.dialog.expr import ExprError, parse_expr
from callcenter.dialog.flow import AfterCall

_WORDS = re.compile(r"[^\w']+")


def _normal(text: str) -> str:
    return " " + _WORDS.sub(" ", text.lower().replace("’", "'")).strip() + " "


def said_any(heard: str, phrases: list[str]) -> bool:
    """Did the caller say one of `phrases` (whole words, case and punctuation aside)?"""
    return any(_normal(p).strip() and _normal(p) in heard for p in phrases)


def _typed(value: Any, kind: str) -> Any:
    if value is None or value == "":
        return None
    if kind == "yes_no":
        return value if isinstance(value, bool) else str(value).strip().lower() in ("yes", "true", "1", "y")
    if kind == "number":
        try:
            number = float(str(value).replace(",", ""))
        except ValueError:
            return None
        return int(number) if number.is_integer() else number
    return str(value)


def fill(after_call: AfterCall, variables: dict[str, Any], outcome: str | None,
         events: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """(the flow's fields, its phrase categories the caller's words put the call in)."""
    heard = _normal(" ".join(e.get("text", "") for e in events if e.get("kind") == ev.STT_FINAL))
    fields: dict[str, Any] = {}
    for name, f in after_call.fields.items():
        if f.from_ is not None:
            fields[name] = _typed(variables.get(f.from_), f.type)
        elif f.when is not None:
            try:
                fields[name] = parse_expr(f.when).truth({**variables, "outcome": outcome})
            except ExprError:
                fields[name] = None
        else:
            fields[name] = said_any(heard, f.phrases)
    categories = [name for name, phrases in after_call.categories.items() if said_any(heard, phrases)]
    return fields, categories
