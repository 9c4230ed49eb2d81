"""Search over past calls: a period's calls whose words hold every word asked for.

A call's words are:
- from its row: the caller, the flow, the intent, the outcome, the slots (sensitive ones masked),
  the post-call summary and categories;
- from its events file: what the caller said and what the agent said.

An events file is read where this machine can reach it: on a many-host fleet, the other hosts'
transcripts are searched through their rows' summaries only."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from callcenter.call import events as ev

SNIPPET_CHARS = 120
WORD = re.compile(r"[\w'*+@.:-]+")


@dataclass
class Found:
    call: dict[str, Any]
    snippet: str  # the first line of the call that holds one of the words

    def as_dict(self) -> dict[str, Any]:
        return {**self.call, "snippet": self.snippet}


def words_of(query: str) -> list[str]:
    return [w.lower() for w in WORD.findall(query)]


def transcript(path: str | None) -> list[str]:
    """`caller: ...` and `agent: ...` lines of a call, from its events file (none if unreadable)."""
    if not path:
        return []
    try:
        events = ev.read_events(path)
    except (OSError, UnicodeDecodeError):
        return []
    who = {ev.STT_FINAL: "caller", ev.AGENT_SAY: "agent"}
    return [f"{who[e['kind']]}: {e['text']}" for e in events if e.get("kind") in who and e.get("text")]


def search(rows: list[dict[str, Any]], query: str) -> list[Found]:
    wanted = words_of(query)
    if not wanted:
        return []
    found = []
    for row in rows:
        lines = [row.get("summary") or "", *transcript(row.get("events"))]
        fields = [str(row.get(k) or "") for k in ("caller", "caller_number", "flow", "intent", "outcome",
                                                  "transfer_to", "queue")]
        fields += [f"{k} {v}" for k, v in (row.get("slots") or {}).items()] + list(row.get("categories") or [])
        text = " ".join(fields + lines).lower()
        if all(w in text for w in wanted):
            hit = next((line for line in lines if any(w in line.lower() for w in wanted)), row.get("summary") or "")
            found.append(Found(row, hit if len(hit) <= SNIPPET_CHARS else hit[:SNIPPET_CHARS - 1] + "…"))
    return found
