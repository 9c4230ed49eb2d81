"""How a call ended, in the store's one vocabulary (`callcenter.store.calls.OUTCOMES`), read from
its events and the session's result: the first that holds of

1. a human agent of a queue answered → `queue_answered`; a transfer was accepted → `transferred`;
2. a voicemail message was left (with speech in it) → `voicemail`;
3. the caller left a queue for a callback → `callback_requested`; its longest wait ran out →
   `queue_timeout`; they hung up in it → `queue_abandoned`;
4. an answering machine answered a dialled call → `machine` (its message left or not);
5. a part of the agent failed for good (`trouble`), or the call ended in an error → `failed`;
6. the flow hung up (a hangup node) → `ai_completed`;
7. otherwise the caller hung up → `caller_hung_up`.
"""

from __future__ import annotations

from typing import Any

from callcenter.call import events as ev
from callcenter.call.latency import turn_latencies
from callcenter.store.calls import (
    AI_COMPLETED,
    CALLBACK_REQUESTED,
    CALLER_HUNG_UP,
    FAILED,
    MACHINE,
    QUEUE_ABANDONED,
    QUEUE_ANSWERED,
    QUEUE_TIMEOUT,
    TRANSFERRED,
    VOICEMAIL,
    CallEnd,
)

LEFT_QUEUE = {"callback": CALLBACK_REQUESTED, "timeout": QUEUE_TIMEOUT, "abandoned": QUEUE_ABANDONED}


def outcome_of(events: list[dict[str, Any]], ended_by: str) -> str:
    kinds = [e for e in events if e.get("kind") in (ev.TRANSFER, ev.VOICEMAIL, ev.QUEUE, ev.TROUBLE)]
    if any(e["kind"] == ev.TRANSFER and e.get("accepted") and e.get("mode") == "queue" for e in kinds):
        return QUEUE_ANSWERED
    if any(e["kind"] == ev.TRANSFER and e.get("accepted") for e in kinds):
        return TRANSFERRED
    if any(e["kind"] == ev.VOICEMAIL and e.get("state") == "saved" and (e.get("seconds") or 0) > 0 for e in kinds):
        return VOICEMAIL
    left = [e.get("why") for e in kinds if e["kind"] == ev.QUEUE and e.get("what") == "left"]
    if left and left[-1] in LEFT_QUEUE:
        return LEFT_QUEUE[left[-1]]
    if any(e.get("kind") == ev.AMD and e.get("decision") == "machine" for e in events):
        return MACHINE
    if ended_by == "error" or any(e["kind"] == ev.TROUBLE for e in kinds):
        return FAILED
    if ended_by == "agent":
        return AI_COMPLETED
    return CALLER_HUNG_UP


def call_end(events: list[dict[str, Any]], ended_by: str, path: list[str], slots: dict[str, Any],
             transferred_to: str | None) -> CallEnd:
    """The row's closing fields from the call's events (dicts, as in the JSONL) and the session's result."""
    intents = [e.get("intent") for e in events if e.get("kind") == ev.FLOW_DECISION and e.get("intent")]
    queued = [e for e in events if e.get("kind") == ev.QUEUE and e.get("what") == "joined"]
    waits = [e.get("waited_s") for e in events if e.get("kind") == ev.QUEUE and e.get("what") == "left"]
    answered = [e for e in events if e.get("kind") == ev.TRANSFER and e.get("mode") == "queue" and e.get("accepted")]
    wait_s = waits[-1] if waits else None
    if answered and queued:
        wait_s = round(answered[-1]["t"] - queued[-1]["t"], 1)
    return CallEnd(outcome=outcome_of(events, ended_by), nodes=path, intent=intents[0] if intents else None,
                   slots=slots, transfer_to=transferred_to, queue=queued[-1].get("queue") if queued else None,
                   queue_wait_s=wait_s,
                   voice_to_voice_ms=[round(t["voice_to_voice"] * 1000, 1) for t in turn_latencies(events)])
