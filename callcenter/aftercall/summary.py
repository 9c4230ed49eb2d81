"""A call's summary, categories and sentiment, by rules over its events and its row: what the caller
asked for, where the flow took them, how it ended, and the signs of a caller in trouble (asking for
a person again and again, talking over the agent, long silences, not being understood).

Everything here reads what is already masked: the events' texts and the row's slots never hold a
card number (see the security guide)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from callcenter.call import events as ev
from callcenter.store.calls import ABANDONED

PERSON = re.compile(r"\b(a |an |the )?(person|human|agent|operator|representative|someone real)\b", re.I)
ASKED_FOR_A_PERSON = 2  # times a caller asks for a person before it is a category
OVER_TALK = 2  # barge-ins before the call is "over-talk"
NOT_UNDERSTOOD = 2  # no-match decisions
SILENCE_S = 8.0  # a gap this long with nobody speaking

OUTCOME_WORDS = {
    "ai_completed": "the agent handled the call to its end",
    "transferred": "the call was transferred",
    "queue_answered": "a human agent answered from the queue",
    "queue_abandoned": "the caller hung up while waiting in the queue",
    "queue_timeout": "the queue's longest wait ran out",
    "callback_requested": "the caller asked to be called back",
    "voicemail": "the caller left a voicemail",
    "caller_hung_up": "the caller hung up before the end",
    "failed": "the call failed",
    "worker_lost": "the call was cut off (its worker stopped)",
    "no_answer": "nobody answered", "busy": "the line was busy", "machine": "an answering machine answered",
}


@dataclass
class CallSummary:
    summary: str
    categories: list[str] = field(default_factory=list)
    sentiment: str = "neutral"  # negative, neutral, positive

    def as_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "categories": self.categories, "sentiment": self.sentiment}


def summarise(row: dict[str, Any], events: list[dict[str, Any]]) -> CallSummary:
    kinds = [e.get("kind") for e in events]
    heard = [e.get("text", "") for e in events if e.get("kind") == ev.STT_FINAL]
    decisions = [e for e in events if e.get("kind") == ev.FLOW_DECISION]
    categories = []
    asked = sum(1 for t in heard if PERSON.search(t))
    if asked >= ASKED_FOR_A_PERSON:
        categories.append("asked_for_a_person")
    if kinds.count(ev.BARGE_IN) >= OVER_TALK:
        categories.append("over_talk")
    if sum(1 for d in decisions if d.get("via") == "no_match") >= NOT_UNDERSTOOD:
        categories.append("not_understood")
    if longest_silence(events) >= SILENCE_S:
        categories.append("long_silence")
    if any(k in (ev.TROUBLE, ev.ERROR) for k in kinds):
        categories.append("technical_trouble")
    intent = row.get("intent")
    if intent:
        categories.append(f"intent:{intent}")
    troubled = {"asked_for_a_person", "over_talk", "not_understood", "technical_trouble"} & set(categories)
    outcome = row.get("outcome") or ""
    sentiment = "negative" if len(troubled) >= 2 or (troubled and outcome in ABANDONED) \
        else "positive" if outcome in ("ai_completed", "queue_answered", "transferred") and not troubled else "neutral"
    return CallSummary(_sentence(row, heard), categories, sentiment)


def _sentence(row: dict[str, Any], heard: list[str]) -> str:
    who = row.get("caller_number") or row.get("caller") or "an unknown caller"
    direction = "We called" if row.get("direction") == "outbound" else "Caller"
    parts = [f"{direction} {who} ({row.get('flow') or 'no flow'})"]
    if row.get("intent"):
        parts.append(f"about {row['intent'].replace('_', ' ')}")
    if heard:
        first = heard[0] if len(heard[0]) <= 80 else heard[0][:77] + "..."
        parts.append(f'saying "{first}"')
    text = " ".join(parts) + "."
    slots = {k: v for k, v in (row.get("slots") or {}).items() if v not in (None, "")}
    if slots:
        text += " Gave " + ", ".join(f"{k} {v}" for k, v in sorted(slots.items())) + "."
    nodes = row.get("nodes") or []
    if nodes:
        text += f" Went through {len(nodes)} step{'s' if len(nodes) != 1 else ''}, last {nodes[-1]}."
    outcome = row.get("outcome")
    if outcome:
        text += f" Outcome: {OUTCOME_WORDS.get(outcome, outcome)}"
        if row.get("transfer_to"):
            text += f" (to {row['transfer_to']})"
        text += "."
    if row.get("started") and row.get("ended"):
        text += f" {row['ended'] - row['started']:.0f} s, {row.get('turns') or 0} turns."
    return text


def longest_silence(events: list[dict[str, Any]]) -> float:
    """The longest stretch with neither side speaking (from the caller's turn ends and starts and
    the agent's playout)."""
    marks = sorted(e["t"] for e in events if e.get("kind") in (ev.SPEECH_START, ev.SPEECH_END, ev.FIRST_RTP_OUT,
                                                                  ev.PLAYOUT_DONE) and "t" in e)
    return max((b - a for a, b in zip(marks, marks[1:])), default=0.0)
