"""Call events: every stage stamps what it did, so a turn's latency is known stage by stage.

Events go to the call's JSONL file (one line each, flushed at once so a crash keeps all of them)
and to any live subscribers (the supervisor console, benchmarks).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from callcenter.text.pan import scrub_cards

# Event kinds, in the order a turn produces them.
CALL_START = "call_start"  # the call is answered: flow, version, caller, how it came in
SPEECH_START = "speech_start"  # the caller starts speaking (a turn begins)
SPEECH_END = "speech_end"  # the caller's turn ends (the silence after their last voiced frame)
STT_PARTIAL = "stt_partial"  # the words heard so far in this turn
TURN_JUDGED = "turn_judged"  # a pause's text judged a finished sentence or not (semantic end of turn)
STT_FINAL = "stt_final"  # the turn's transcript, with its confidence and how early it was decoded
SPEECH_IGNORED = "speech_ignored"  # a sound taken for no speech (a cough, a line click, the agent's own echo)
AGENT_PAUSED = "agent_paused"  # the agent's voice held: the caller may be barging in
AGENT_RESUMED = "agent_resumed"  # the agent's voice goes on: it was not a barge-in
DTMF = "dtmf"  # a key the caller pressed (RFC 4733 or an in-band tone)
FLOW_DECISION = "flow_decision"  # the flow moved: node, intent, score, how (speech, keypad, no_match...), slots
WEBHOOK = "webhook"  # a flow's HTTP request and its status (secrets and card numbers masked)
LLM_REQUEST = "llm_request"  # the language model was asked (which node, which provider)
LLM_REPLY = "llm_reply"  # the model's reply: choice, slots, tool, via (model, embedding path, fell back)
# llm_reply's `via` in the offline hybrid when the model took the turn but the embedding path answered
LLM_FELL_BACK = ("busy", "unsure", "slow", "withheld", "failed")
VOICEMAIL = "voicemail"  # a voicemail recorded: its file and length
AGENT_SAY = "agent_say"  # a sentence the agent says (masked where sensitive)
TTS_FIRST_AUDIO = "tts_first_audio"  # the voice's first audio of an utterance
FIRST_RTP_OUT = "first_rtp_out"  # the utterance's first frame on the line
FIRST_SOUND_OUT = "first_sound_out"  # the first frame of an utterance that carries its voice
PLAYOUT_DONE = "playout_done"  # the utterance's last frame on the line
BARGE_IN = "barge_in"  # the caller spoke over the agent, who stopped
TRANSFER = "transfer"  # a transfer: to whom, blind, warm or to a queue, and whether it was accepted
TRANSFER_SUMMARY = "transfer_summary"  # the triage summary given to whoever takes the call
HANGUP = "hangup"  # the agent hangs up
CALL_END = "call_end"  # the call is over: who ended it, its outcome, duration
SUPERVISOR = "supervisor"  # a supervisor's action: say, take_over, release, pause, transfer, hangup, listen...
EVENT_FIELDS = frozenset({"kind", "call_id", "t", "wall", "turn"})  # every event's own; data never displaces them
PRIVACY = "privacy"  # private: a card number is being given or read back (the supervisor hears neither side)
MARKED = "marked"  # a supervisor marked the call for review, with a note
ERROR = "error"  # a stage or task failed (a traceback is in the log)
MEDIA = "media"  # at the end: frames sent, how many left late (the transport missed its 20 ms tick)
STAGE_SLOW = "stage_slow"  # a stage is late: the caller hears "one moment"
STAGE_FALLBACK = "stage_fallback"  # a stage failed and its backup took over (the voice → espeak-ng)
QUEUE = "queue"  # a queue of agents: joined, position, ring, no_answer, answered, left (with why)
AGENT_WHISPER = "agent_whisper"  # the triage summary spoken to the agent who answered, before the bridge
CALL_STATE = "call_state"  # the call's state changed: to what, from what (was), who drives it now (driver)
TROUBLE = "trouble"  # a stage failed for good: the caller is told, then transferred or let go
AMD = "amd"  # a dialled call's answering-machine detection: greeted (the flow starts), decided, beep, message


@dataclass
class Event:
    kind: str
    call_id: str
    t: float  # seconds since call start (monotonic)
    wall: float  # unix time
    turn: int
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The event as the JSONL holds it (its own fields win over data of the same name)."""
        return {**self.data, "kind": self.kind, "call_id": self.call_id, "t": round(self.t, 4),
                "wall": round(self.wall, 4), "turn": self.turn}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), ensure_ascii=False)


class CallEvents:
    """The event log of one call: a JSONL file plus live subscribers. Thread-safe enough for
    emits from the asyncio loop; the media thread hands its stamps over through the loop."""

    def __init__(self, call_id: str, path: str | Path | None = None, clock: Callable[[], float] = time.monotonic):
        self.call_id = call_id
        self._clock = clock
        self._t0 = clock()
        self.turn = 0
        self.history: list[Event] = []
        self._subscribers: list[Callable[[Event], None]] = []
        self._fd: int | None = None
        self.path: Path | None = None
        # the call's secrets (card numbers, webhook keys) are scrubbed from every event before it is
        # kept, written or sent (see dialog.redact)
        self.scrub: Callable[[Any], Any] | None = None
        if path:
            self.open(path)

    def open(self, path: str | Path) -> None:
        """Start writing the JSONL file (mode 600 in a folder of mode 700; never an existing file),
        beginning with the events so far: a call's files appear only once its media flows."""
        from callcenter.call.recording import create_private

        self.path = Path(path)
        self._fd = create_private(self.path, append=True)
        for ev in self.history:
            self._write(ev)

    def _write(self, ev: Event) -> None:
        # a lone surrogate (from a client's text) must not break the log: written as U+FFFD
        os.write(self._fd, (ev.to_json() + "\n").encode("utf-8", "replace"))

    def now(self) -> float:
        return self._clock() - self._t0

    def since_start(self, clock_time: float) -> float:
        """A time read from this log's clock, as seconds since the call started."""
        return clock_time - self._t0

    def subscribe(self, fn: Callable[[Event], None]) -> None:
        self._subscribers.append(fn)

    def next_turn(self) -> int:
        self.turn += 1
        return self.turn

    def emit(self, kind: str, /, **data: Any) -> Event:
        """Record an event now. `data`'s names are free (a flow's slot may be called `at` or `kind`):
        none of them is a parameter of this method."""
        return self.emit_at(kind, None, **data)

    def emit_at(self, kind: str, at: float | None, /, **data: Any) -> Event:
        """Record an event that happened at `at` (seconds since the call started; None: now)."""
        data = (self.scrub or scrub_cards)(data)  # a card number never reaches the file or the console
        ev = Event(kind, self.call_id, self.now() if at is None else at, time.time(), self.turn, data)
        self.history.append(ev)
        if self._fd is not None:
            self._write(ev)
        for fn in self._subscribers:
            fn(ev)
        return ev

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def transcript(self) -> list[tuple[str, str]]:
        """(speaker, text) pairs: what the caller said or keyed and what the agent said."""
        out = []
        for ev in self.history:
            if ev.kind == STT_FINAL and ev.data.get("text"):
                out.append(("caller", ev.data["text"]))
            elif ev.kind == DTMF:
                out.append(("caller", f"[keypad {ev.data['digit']}]"))
            elif ev.kind == AGENT_SAY:
                out.append(("agent", ev.data["text"]))
        return out


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL event file, skipping a last line cut short by a crash."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
