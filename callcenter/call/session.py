"""One call, conducted: caller audio → turn taking → recognition → dialog → voice → playout.

`CallSession` builds the call's parts and runs it; each part has one job and lives in its own
module, so a new feature is a new module plugged in here, not more lines of this one:

- `Hearing` (`call/hearing.py`): caller frames through the listener (echo canceller, noise gate,
  turn detector, keypad tones), decodes while the caller pauses, barge-in;
- `FlowRunner` (`call/flow_runner.py`): one engine step at a time, webhooks and model turns, the
  no-input timer;
- `Speaking` (`call/speaking.py`): the voice into the media bridge, the backup voice, `interrupt()`;
- the features (`call/features/`): transfers, queue waits, voicemail, the supervisor's controls,
  card-number privacy, answering-machine detection on dialled calls;
- `CallStatus` (`call/state.py`): the call's one state field, its allowed transitions, and a
  `call_state` event on every change.

Data flows one way. The transport (SIP, WebRTC or the offline simulator) only delivers frames,
keypad digits and the end of the call, and carries out transfer and hang-up. What the call needs
from the world is typed in `call/ports.py`: `Recognizer`, `Voice`, `MediaLine`, `CallControl`."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from callcenter.call import events as ev
from callcenter.call.events import CallEvents
from callcenter.call.features import Features
from callcenter.call.features.supervisor import SUPERVISOR_GOODBYE
from callcenter.call.features.transfer import GOODBYE_GRACE_S
from callcenter.call.flow_runner import FlowRunner
from callcenter.call.hearing import HOLD_ON_TEXT, STT_GIVE_UP_S, Hearing
from callcenter.call.ports import CallControl, MediaLine, Recognizer, Voice
from callcenter.call.speaking import Speaking, unless_stalled
from callcenter.call.state import CallStatus
from callcenter.call.tasks import CallTasks
from callcenter.dialog.engine import Dialog, Enqueue, Hangup, Listen, Record, Say, Silence, Transfer, Waiting
from callcenter.dialog.flow import Flow
from callcenter.dialog.services import FlowServices
from callcenter.hearing.front import HearingConfig

__all__ = ["CallControl", "CallSession", "SessionResult", "HOLD_ON_TEXT", "STT_GIVE_UP_S", "unless_stalled",
           "recording_paths"]

log = structlog.get_logger()


@dataclass
class SessionResult:
    ended_by: str = "caller"  # caller, agent, transfer, error
    transcript: list[tuple[str, str]] = field(default_factory=list)
    path: list[str] = field(default_factory=list)  # the flow nodes the call passed, in order
    variables: dict = field(default_factory=dict)  # the flow's variables (slots, webhook results) at the end
    transferred_to: str | None = None


@dataclass(frozen=True)
class CallOrigin:
    """Where the call came in, for its call_start event."""
    flow_digest: str | None = None
    worker: str | None = None  # which agent process took the call (serve --workers)
    transport: str | None = None  # sip, webrtc (None: a simulated line)
    transport_id: dict[str, str] = field(default_factory=dict)  # the transport's own name for the call


class CallSession:
    def __init__(self, call_id: str, flow: Flow, bridge: MediaLine, control: CallControl, events: CallEvents,
                 stt: Recognizer, tts: Voice, hearing: HearingConfig | None = None, services: FlowServices | None = None,
                 variables: dict | None = None, flow_digest: str | None = None, now=None, worker: str | None = None,
                 transport: str | None = None, backup_tts: Voice | None = None, transport_id: dict[str, str] | None = None):
        self.call_id, self.bridge, self.control, self.events = call_id, bridge, control, events
        self.origin = CallOrigin(flow_digest, worker, transport, transport_id or {})
        self.log = log.bind(call_id=call_id)
        self.dialog = Dialog(flow, variables={"call_id": call_id, **(variables or {})}, now=now)
        events.scrub = self.dialog.redactor.scrub  # card numbers and webhook keys never leave the call
        self.result = SessionResult()
        self.status = CallStatus(self)  # the call's one state: who has it, what it is doing
        self.ending_by: str | None = None  # set when the agent starts ending the call itself
        # the parts, each with one job
        self.tasks = CallTasks(self)
        self.speaking = Speaking(self, tts, backup_tts)
        self.hearing = Hearing(self, stt, hearing)
        self.runner = FlowRunner(self, services or FlowServices(flow))
        self.features = Features(self)

    @property
    def flow(self) -> Flow:
        return self.dialog.flow

    @property
    def ended(self) -> asyncio.Event:
        return self.status.ended

    # ------------------------------------------------------------ lifecycle
    async def run(self) -> SessionResult:
        o = self.origin
        self.events.emit(ev.CALL_START, flow=self.flow.name, flow_version=self.flow.version,
                         direction=self.dialog.variables.get("direction", "inbound"),
                         **({"flow_digest": o.flow_digest} if o.flow_digest else {}),
                         **({"worker": o.worker} if o.worker else {}),
                         **({"transport": o.transport} if o.transport else {}), **o.transport_id)
        self.tasks.loop(self.hearing.run, "hear")
        self.tasks.loop(self._perform, "speak")
        if not self.features.machine.screen():  # a dialled call's flow starts when a person is heard
            self.runner.act(self.dialog.start())
        self.features.privacy.guard()
        await self.ended.wait()
        await self._shutdown()
        return self.result

    @property
    def in_trouble(self) -> bool:
        return self.features.trouble.active

    def trouble(self, stage: str) -> None:
        """A part of the agent failed: stop the flow, tell the caller, transfer them or let them go."""
        self.features.trouble.begin(stage)

    def end(self, by: str) -> None:
        """The call is over (caller hung up, or the agent finished)."""
        if not self.ended.is_set():
            self.result.ended_by = self.ending_by or by
            self.status.end(by)
            self.runner.call_ended()

    async def _shutdown(self) -> None:
        self.speaking.interrupt(reason="call ended", emit=False)
        self.runner.cancel_no_input()
        await self.tasks.shutdown()
        self.result.transcript = self.events.transcript()
        self.result.path = list(self.dialog.path)
        self.result.variables = dict(self.dialog.variables)
        self.events.emit(ev.MEDIA, **self.bridge.media_stats())
        self.events.emit(ev.CALL_END, ended_by=self.result.ended_by)

    # ------------------------------------------------------------ the flow's actions, in order
    async def _perform(self) -> None:
        """Carries out the flow's actions in order: speaks prompts, then listens, records,
        transfers, waits in a queue or hangs up."""
        while True:
            action = await self.speaking.queue.get()
            if isinstance(action, Say):
                await self.speaking.say(action.text, action.voice, action.private, action.audio)
            elif isinstance(action, Silence):
                await asyncio.sleep(action.ms / 1000)
            elif isinstance(action, Listen):
                self.runner.start_no_input(action.timeout_s)
            elif isinstance(action, Record):
                await self.features.voicemail.record(action)
            elif isinstance(action, Transfer):
                if await self.features.transfer.carry_out(action):
                    return
            elif isinstance(action, Enqueue):
                if await self.features.queue.carry_out(action):
                    return
            elif isinstance(action, Hangup):
                await asyncio.sleep(GOODBYE_GRACE_S)
                self.ending_by = "agent"
                self.events.emit(ev.HANGUP, by="agent")
                await self.control.hangup()
                self.end("agent")
                return
            else:  # a new action kind nobody taught this loop: say so instead of dropping it silently
                self.log.error("unknown_action", action=repr(action))

    # ------------------------------------------------------------ what others ask of the call
    @property
    def state(self) -> str:
        """What the call is doing, for the supervisor's table."""
        return self.status.shown.value

    @property
    def slot_names(self) -> set[str]:
        """The flow's slots: what the call's row keeps of its variables."""
        return {n for node in self.flow.nodes.values() for n in (getattr(node, "slots", None) or {})}

    @property
    def utterances_spoken(self) -> int:
        return self.speaking.spoken

    @property
    def agent_speaking(self) -> bool:
        return self.speaking.speaking

    @property
    def busy(self) -> bool:
        """The agent is talking or still working out its answer to the caller."""
        return self.speaking.speaking or self.runner.in_flight > 0 or self.hearing.listener.in_speech or \
            self.dialog.waiting in (Waiting.FETCH, Waiting.LLM)

    @property
    def recording_voicemail(self) -> bool:
        return self.features.voicemail.recording

    @property
    def bridged(self) -> bool:
        """A person has the caller now (a warm transfer, a queue's agent)."""
        return self.status.bridged

    @property
    def held(self) -> bool:
        return self.status.held

    def interrupt(self, reason: str, emit: bool = True) -> None:
        self.speaking.interrupt(reason, emit)

    def on_dtmf(self, digit: str, source: str = "rfc4733") -> None:
        self.hearing.on_dtmf(digit, source)

    # the supervisor's controls (the control API's actions)
    def supervisor_say(self, text: str) -> None:
        self.features.supervision.say(text)

    def take_over(self) -> None:
        self.features.supervision.take_over()

    def release(self) -> None:
        self.features.supervision.release()

    def pause(self) -> None:
        self.features.supervision.pause()

    def supervisor_transfer(self, uri: str) -> None:
        self.features.supervision.transfer(uri)

    def supervisor_enqueue(self, queue: str) -> None:
        self.features.supervision.enqueue(queue)

    def supervisor_transfer_to_agent(self, name: str, uri: str) -> None:
        self.features.supervision.transfer_to_agent(name, uri)

    def supervisor_hangup(self, goodbye: str = SUPERVISOR_GOODBYE) -> None:
        self.features.supervision.hangup(goodbye)

    def mark(self, note: str) -> None:
        self.features.supervision.mark(note)

    @property
    def marked(self) -> str | None:
        return self.features.supervision.marked


def recording_paths(root: str | Path, call_id: str) -> tuple[Path, Path]:
    """Where a call is recorded: `<root>/<YYYY-MM-DD>/<call_id>.wav` and `.jsonl`. `call_id` is the
    server's own id (never a caller's Call-ID, which could name another folder)."""
    if not call_id or "/" in call_id or call_id.startswith("."):
        raise ValueError(f"not a call id to name files by: {call_id!r}")
    day = Path(root) / time.strftime("%Y-%m-%d")
    return day / f"{call_id}.wav", day / f"{call_id}.jsonl"
