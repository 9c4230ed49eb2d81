"""One row per call: who called, when, on which worker and host, the flow's path and slots (sensitive
ones masked), how it ended, and where its recording and events are. The per-call JSONL and WAV stay
the raw record; the row is what reports, search and outbound calling read.

How a call ended is one word of one vocabulary (`OUTCOMES`), the same for every feature:

| outcome | the call |
|---|---|
| `ai_completed` | the flow ran to its end (a hangup node) with the AI agent alone |
| `transferred` | was put through to a number or SIP URI (a blind or warm transfer) |
| `queue_answered` | waited in a queue and a human agent answered |
| `queue_abandoned` | hung up while waiting in a queue |
| `queue_timeout` | waited the queue's longest wait and went the flow's way (and left no message) |
| `callback_requested` | left the queue asking to be called back |
| `voicemail` | left a voicemail message |
| `caller_hung_up` | the caller hung up before the flow's end, outside any queue |
| `failed` | a part of the agent failed for good, or the call could not be set up |
| `worker_lost` | the worker that had the call died (kill -9, a crash, a lost host) |
| `machine`, `no_answer`, `busy`, `dnc_skipped` | outbound calls: an answering machine, nobody, a busy line, a number on the do-not-call list |
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

from callcenter.store.db import Database

AI_COMPLETED = "ai_completed"
TRANSFERRED = "transferred"
QUEUE_ANSWERED = "queue_answered"
QUEUE_ABANDONED = "queue_abandoned"
QUEUE_TIMEOUT = "queue_timeout"
CALLBACK_REQUESTED = "callback_requested"
VOICEMAIL = "voicemail"
CALLER_HUNG_UP = "caller_hung_up"
FAILED = "failed"
WORKER_LOST = "worker_lost"
MACHINE = "machine"
NO_ANSWER = "no_answer"
BUSY = "busy"
DNC_SKIPPED = "dnc_skipped"
# groups of outcomes several readers share (reports, summaries, the dialer)
ABANDONED = (CALLER_HUNG_UP, QUEUE_ABANDONED)  # the caller hung up first, outside a queue or in one
UNANSWERED = (NO_ANSWER, BUSY, FAILED)  # a dialled call nobody took: tried again while attempts remain
OUTCOMES = (AI_COMPLETED, TRANSFERRED, QUEUE_ANSWERED, QUEUE_ABANDONED, QUEUE_TIMEOUT, CALLBACK_REQUESTED,
            VOICEMAIL, CALLER_HUNG_UP, FAILED, WORKER_LOST, MACHINE, NO_ANSWER, BUSY, DNC_SKIPPED)

COLUMNS = ("call_id", "direction", "transport", "caller", "caller_number", "started", "answered", "ended",
           "worker", "host", "flow", "flow_version", "nodes", "intent", "slots", "outcome", "transfer_to", "queue",
           "queue_wait_s", "turns", "voice_to_voice_p50_ms", "voice_to_voice_max_ms", "recording", "events",
           "summary", "categories", "sentiment", "after_call", "scores")
JSON_COLUMNS = ("nodes", "slots", "categories", "after_call", "scores")


@dataclass
class CallEnd:
    """What a call's row learns when it ends."""
    outcome: str
    nodes: list[str]
    intent: str | None = None
    slots: dict[str, Any] | None = None  # sensitive values already masked
    transfer_to: str | None = None
    queue: str | None = None
    queue_wait_s: float | None = None
    voice_to_voice_ms: list[float] | None = None


class CallRecords:
    """The `calls` table."""

    def __init__(self, db: Database, worker: str, host: str, clock=time.time):
        self.db, self.worker, self.host, self.clock = db, worker, host, clock

    def started(self, call_id: str, *, direction: str = "inbound", transport: str = "sip", caller: str = "",
                caller_number: str = "", flow: str = "", flow_version: int | None = None,
                recording: str | None = None, events: str | None = None, answered: bool = True) -> None:
        """A call's row, as the call starts (`answered=False`: a dialled call nobody answered)."""
        now = self.clock()
        with self.db.transaction():
            self.db.execute(
                "INSERT INTO calls(call_id, direction, transport, caller, caller_number, started, answered, worker, "
                "host, flow, flow_version, recording, events) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(call_id) DO NOTHING",
                (call_id, direction, transport, caller, caller_number, now, now if answered else None, self.worker,
                 self.host, flow,
                 flow_version, recording, events))

    def ended(self, call_id: str, end: CallEnd) -> None:
        if end.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {end.outcome!r}")
        v2v = [v for v in end.voice_to_voice_ms or [] if v is not None]
        with self.db.transaction():
            self.db.execute(
                "UPDATE calls SET ended=?, outcome=?, nodes=?, intent=?, slots=?, transfer_to=?, queue=?, "
                "queue_wait_s=?, turns=?, voice_to_voice_p50_ms=?, voice_to_voice_max_ms=? WHERE call_id=?",
                (self.clock(), end.outcome, json.dumps(end.nodes), end.intent, json.dumps(end.slots or {}, default=str),
                 end.transfer_to, end.queue, end.queue_wait_s, len(v2v),
                 round(statistics.median(v2v), 1) if v2v else None, round(max(v2v), 1) if v2v else None, call_id))

    def lost(self, workers: list[str]) -> int:
        """Calls of dead workers that never ended get `worker_lost` (inside the caller's transaction)."""
        if not workers:
            return 0
        marks = ",".join("?" * len(workers))
        open_calls = self.db.execute(f"SELECT call_id FROM calls WHERE outcome IS NULL AND worker IN ({marks})",
                                     tuple(workers))
        self.db.execute(f"UPDATE calls SET outcome=?, ended=? WHERE outcome IS NULL AND worker IN ({marks})",
                        (WORKER_LOST, self.clock(), *workers))
        return len(open_calls)

    def between(self, since: float, until: float, limit: int = 100_000) -> list[dict[str, Any]]:
        """The calls that started in [since, until), oldest first."""
        rows = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM calls WHERE started >= ? AND started < ? "
                               "ORDER BY started LIMIT ?", (since, until, limit))
        return [_call(row) for row in rows]

    def summarised(self, call_id: str, summary: str, categories: list[str], sentiment: str,
                   after_call: dict[str, Any] | None = None) -> None:
        """What the post-call work found (call/aftercall): a short summary, categories, sentiment,
        and the flow's own after-call fields."""
        with self.db.transaction():
            self.db.execute("UPDATE calls SET summary=?, categories=?, sentiment=?, after_call=? WHERE call_id=?",
                            (summary, json.dumps(categories), sentiment, json.dumps(after_call or {}), call_id))

    def scored(self, call_id: str, scores: dict[str, Any]) -> None:
        """The flow's scorecard, scored (call/aftercall/scorecard.py)."""
        with self.db.transaction():
            self.db.execute("UPDATE calls SET scores=? WHERE call_id=?", (json.dumps(scores), call_id))

    def override_score(self, call_id: str, item: str, passed: bool, note: str, by: str) -> dict[str, Any]:
        """A supervisor's own score for one item, with a note: kept beside the automatic one, and
        the call's total counts it instead. KeyError: no such call, or no such item on its card."""
        with self.db.transaction():
            rows = self.db.execute("SELECT scores FROM calls WHERE call_id=?", (call_id,))
            if not rows:
                raise KeyError(f"no call {call_id!r} in the store")
            scores = json.loads(rows[0][0] or "{}")
            items = scores.get("items", {})
            if item not in items:
                raise KeyError(f"call {call_id} has no scorecard item {item!r}"
                               f" (its items: {', '.join(sorted(items)) or 'none: not scored'})")
            items[item]["override"] = {"score": "pass" if passed else "fail", "note": note, "by": by,
                                       "at": round(time.time(), 3)}
            scores["total"] = score_total(items)
            self.db.execute("UPDATE calls SET scores=? WHERE call_id=?", (json.dumps(scores), call_id))
            return scores

    def get(self, call_id: str) -> dict[str, Any] | None:
        rows = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM calls WHERE call_id=?", (call_id,))
        return _call(rows[0]) if rows else None


def final_score(item: dict[str, Any]) -> str:
    """An item's score: the supervisor's where they gave one, else the automatic one."""
    return (item.get("override") or {}).get("score") or item.get("score", "n/a")


def score_total(items: dict[str, dict[str, Any]]) -> float | None:
    """The share of a call's applicable items that passed (None: none applied)."""
    scored = [final_score(i) for i in items.values() if final_score(i) != "n/a"]
    return round(sum(s == "pass" for s in scored) / len(scored), 3) if scored else None


def _call(row: tuple) -> dict[str, Any]:
    """A row of `calls` as a dict, its JSON columns decoded."""
    call = dict(zip(COLUMNS, row))
    for key in JSON_COLUMNS:
        call[key] = json.loads(call[key] or ("{}" if key == "slots" else "[]"))
    return call
