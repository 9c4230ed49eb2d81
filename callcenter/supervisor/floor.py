"""What the supervisor's console knows about the floor: every live call of every connected agent
server, each call's recent events, and the day's aggregates. Pure state, fed by the control API's
messages; the Textual app only draws it."""

from __future__ import annotations

import datetime as dt
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from callcenter.call.latency import turn_latencies

MAX_EVENTS_PER_CALL = 2000
# a flow_decision's own fields; anything else in it is a slot the flow heard
DECISION_FIELDS = frozenset({"kind", "call_id", "t", "wall", "turn", "node", "intent", "score", "via", "next_node"})
MAX_FINISHED = 200  # ended calls kept for the aggregates and a last look
ENDED_SHOWN_S = 30.0  # an ended call stays in the table this long (dimmed), so a supervisor sees how it ended
ENDED_SHOWN = 5  # at most this many ended calls at once
# the stages of a turn, in order, as the waterfall shows them: (label, field of turn_latencies)
WATERFALL = (("end of turn", "endpoint"), ("STT final", "stt"), ("flow", "flow"), ("LLM/webhook", "wait"),
             ("TTS audio", "tts"), ("RTP out", "transport"))


def transcript_lines(events) -> list[tuple[str, str]]:
    """(who, text) lines: caller finals, agent prompts, keys, decisions, supervisor actions."""
    out = []
    for e in events:
        kind = e.get("kind")
        if kind == "stt_final" and e.get("text"):
            out.append(("caller", e["text"]))
        elif kind == "dtmf" and not e.get("ignored"):
            if out and out[-1][0] == "keypad":  # a number keyed is one line, not one line a key
                out[-1] = ("keypad", out[-1][1] + e["digit"])
            else:
                out.append(("keypad", e["digit"]))
        elif kind == "agent_say":
            out.append(("agent", e["text"]))
        elif kind == "flow_decision":
            if e.get("via") == "keypad" and e.get("next_node") == e.get("node"):
                continue  # a key of a number still being keyed: the keypad line says it
            what = e.get("intent") or e.get("via")
            slots = {k: v for k, v in e.items() if k not in DECISION_FIELDS}
            shown = "".join(f", {k}: {v}" for k, v in slots.items())  # what the flow heard (masked if sensitive)
            out.append(("flow", f"{e.get('node')} → {e.get('next_node')} ({what}{shown})"))
        elif kind == "supervisor":
            out.append(("supervisor", e.get("text") or e.get("action", "")))
        elif kind == "transfer" and "accepted" in e:
            out.append(("flow", f"transfer to {e.get('to')}: {'accepted' if e['accepted'] else 'failed'}"))
        elif kind == "privacy":
            out.append(("flow", "a card number is being taken: you hear neither side" if e.get("private")
                        else "card number taken: listening again"))
        elif kind == "call_end":
            out.append(("flow", f"call ended by {e.get('ended_by')}"))
    return out


@dataclass
class CallView:
    server: str
    call_id: str
    row: dict[str, Any] = field(default_factory=dict)
    events: deque = field(default_factory=lambda: deque(maxlen=MAX_EVENTS_PER_CALL))
    partial: str = ""  # the caller's words so far in the current turn
    ended: bool = False
    ended_at: float | None = None  # wall clock

    @property
    def key(self) -> str:
        return f"{self.server}|{self.call_id}"

    def transcript(self) -> list[tuple[str, str]]:
        return transcript_lines(self.events)

    def turns(self) -> list[dict]:
        return turn_latencies(list(self.events))


class Floor:
    def __init__(self, today: dt.date | None = None):
        self.calls: dict[str, CallView] = {}
        self.finished: deque[CallView] = deque(maxlen=MAX_FINISHED)
        self.servers: dict[str, str] = {}  # url -> connected | disconnected: reason
        self.today = today or dt.date.today()
        self.seen_today: set[str] = set()
        self.transfers = 0
        self.abandoned = 0
        self.voice_to_voice: deque[float] = deque(maxlen=2000)
        self.dropped = 0
        self.model_paths: dict[str, int] = {}  # the offline hybrid's turns by path (llm_reply via)

    def view(self, server: str, call_id: str) -> CallView:
        key = f"{server}|{call_id}"
        if key not in self.calls:
            self.calls[key] = CallView(server, call_id)
        return self.calls[key]

    def hello(self, server: str, message: dict) -> None:
        for call_id, events in message.get("history", {}).items():
            view = self.view(server, call_id)
            view.events.clear()
            for e in events:
                self.event(server, e, replay=True)
        self.table(server, message.get("calls", []))

    def recorded(self, server: str, recordings: list[dict]) -> None:
        """Past calls from the server's recordings: today's count toward "calls today"."""
        for rec in recordings:
            started = rec.get("started")
            if started and dt.datetime.fromtimestamp(started).date() == self.today:
                self.seen_today.add(f"{server}|{rec.get('call_id')}")

    def table(self, server: str, rows: list[dict]) -> None:
        live = set()
        for row in rows:
            view = self.view(server, row["call_id"])
            view.row = row
            live.add(view.key)
        for key, view in list(self.calls.items()):
            if view.server == server and key not in live and (view.ended or view.row):
                self._finish(key)

    def event(self, server: str, e: dict, replay: bool = False) -> CallView:
        view = self.view(server, e["call_id"])
        view.events.append(e)
        kind = e.get("kind")
        if kind == "call_start":
            day = dt.datetime.fromtimestamp(e.get("wall", 0)).date()
            if day == self.today:
                self.seen_today.add(view.key)
        elif kind == "stt_partial":
            view.partial = e.get("text", "")
        elif kind in ("stt_final", "speech_start"):
            view.partial = ""
        elif kind == "first_rtp_out" and not replay:
            for t in view.turns()[-1:]:
                if t["turn"] == e.get("turn"):
                    self.voice_to_voice.append(t["voice_to_voice"])
        elif kind == "transfer" and e.get("accepted"):
            self.transfers += 1
        elif kind == "llm_reply" and e.get("via") and not replay:
            self.model_paths[e["via"]] = self.model_paths.get(e["via"], 0) + 1
        elif kind == "flow_decision" and e.get("next_node"):
            view.row["node"] = e["next_node"]
        elif kind == "privacy":
            view.row["private"] = bool(e.get("private"))
        elif kind == "call_end":
            view.ended = True
            view.ended_at = e.get("wall") or time.time()
            spoke = any(x.get("kind") in ("stt_final", "dtmf") for x in view.events)
            if e.get("ended_by") == "caller" and not spoke:
                self.abandoned += 1
            view.row["state"] = "ended"
        return view

    def _finish(self, key: str) -> None:
        view = self.calls.pop(key)
        if view.ended_at is None:  # gone from the server's table without a call_end (its server went away)
            view.ended, view.ended_at = True, time.time()
            view.row["state"] = "ended"
        self.finished.append(view)

    def find(self, key: str | None) -> CallView | None:
        """A live call, or one that ended lately."""
        if key is None:
            return None
        if key in self.calls:
            return self.calls[key]
        return next((v for v in reversed(self.finished) if v.key == key), None)

    def shown(self, now_wall: float) -> list[CallView]:
        """What the calls table lists: the live calls, then the last few that ended within
        ENDED_SHOWN_S (newest first)."""
        ended = {v.key: v for v in self.finished if v.ended_at is not None and now_wall - v.ended_at <= ENDED_SHOWN_S}
        ended.update({v.key: v for v in self.calls.values() if v.ended and v.row and v.ended_at is not None
                      and now_wall - v.ended_at <= ENDED_SHOWN_S})
        recent = sorted(ended.values(), key=lambda v: v.ended_at or 0, reverse=True)[:ENDED_SHOWN]
        return self.live() + recent

    def live(self) -> list[CallView]:
        return sorted((v for v in self.calls.values() if v.row and not v.ended),
                      key=lambda v: v.row.get("started") or 0)

    def alerts(self, now_wall: float) -> list[tuple[str, str]]:
        """(call key, what) for every live call that needs a look."""
        return [(v.key, f"{v.row.get('caller', v.call_id)}: {', '.join(why)}")
                for v in self.live() if (why := call_alerts(v, now_wall))]

    def aggregates(self) -> dict[str, Any]:
        v2v = sorted(self.voice_to_voice)

        def pct(q: float) -> float | None:
            if not v2v:
                return None
            return v2v[min(len(v2v) - 1, int(q * len(v2v)))]

        return {"now": len(self.live()), "today": len(self.seen_today), "transfers": self.transfers,
                "abandoned": self.abandoned,
                "v2v_p50": statistics.median(v2v) if v2v else None, "v2v_p95": pct(0.95)}


NO_MATCH_ALERT = 2  # "no match" decisions in one call before it is flagged
HUMAN_ASKS_ALERT = 3  # times a caller asked for a person
SILENCE_ALERT_S = 20.0  # a live call where neither side has said anything this long
HUMAN_WORDS = ("human", "person", "agent", "operator", "representative", "somebody real", "real person")


def call_alerts(view: CallView, now_wall: float) -> list[str]:
    """Why a supervisor should look at this call now: the flow keeps missing what the caller says,
    the caller keeps asking for a person, or the line has gone quiet."""
    out = []
    events = list(view.events)
    misses = sum(1 for e in events if e.get("kind") == "flow_decision" and e.get("via") == "no_match")
    if misses >= NO_MATCH_ALERT:
        out.append(f"{misses} no-match")
    asks = sum(1 for e in events if e.get("kind") == "stt_final"
               and any(w in str(e.get("text", "")).lower() for w in HUMAN_WORDS))
    if asks >= HUMAN_ASKS_ALERT:
        out.append(f"asked for a person {asks}×")
    spoken = [e.get("wall", 0) for e in events if e.get("kind") in ("speech_start", "agent_say", "dtmf")]
    state = view.row.get("state", "")
    quiet_since = max(spoken) if spoken else view.row.get("started") or 0
    if quiet_since and now_wall - quiet_since > SILENCE_ALERT_S and state not in ("bridged", "queued", "voicemail"):
        out.append(f"silent {int(now_wall - quiet_since)} s")
    return out


def waterfall(turn: dict) -> list[tuple[str, float, bool]]:
    """(stage, seconds, is the slowest) for one turn."""
    stages = [(label, max(0.0, float(turn.get(key, 0.0)))) for label, key in WATERFALL]
    slowest = max(range(len(stages)), key=lambda i: stages[i][1])
    return [(label, s, i == slowest) for i, (label, s) in enumerate(stages)]
