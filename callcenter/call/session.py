"""One call, conducted: caller audio → turn taking → recognition → dialog → voice → playout.

`CallSession` builds the call's parts and runs it; each part has one job and lives in its own
module, so a new feature is a new module plugged in here, not more lines of this one:

- `Hearing` (`call/hearing.py`): caller frames through the listener (echo canceller, noise gate,
  turn detector, keypad tones), decodes while the caller pauses, barge-in;
- `FlowRunner` (`call/flow_runner.py`): one engine step at a time, webhooks and model turns, the
  no-input timer;
- `Speaking` (`call/speaking.py`): the voice into the media bridge, the backup voice, `interrupt()`;
- the features (`call/features/`): transfers, queue waits, voicemail, the supervisor's controls,
  card-number privacy;
- `call_state` (`call/state.py`): what the call is doing, with the precedence of its parts.

Data flows one way. The transport (SIP, WebRTC or the offline simulator) only delivers frames,
keypad digits and the end of the call, and carries out transfer and hang-up (`CallControl`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from callcenter.call import events as ev
from callcenter.call.attendant import QueueWait
from callcenter.call.bridge import MediaBridge
from callcenter.call.events import CallEvents
from callcenter.call.features.privacy import Privacy
from callcenter.call.features.queue_wait import QueueWaiting
from callcenter.call.features.supervisor import SUPERVISOR_GOODBYE, Supervision
from callcenter.call.features.transfer import GOODBYE_GRACE_S, Transferring
from callcenter.call.features.voicemail import Voicemail
from callcenter.call.flow_runner import FlowRunner
from callcenter.call.hearing import HOLD_ON_TEXT, STT_GIVE_UP_S, Hearing
from callcenter.call.speaking import Speaking, unless_stalled
from callcenter.call.state import call_state
from callcenter.dialog.engine import Dialog, Enqueue, Hangup, Listen, Record, Say, Silence, Transfer
from callcenter.dialog.flow import Flow, trouble_destination
from callcenter.dialog.services import FlowServices
from callcenter.hearing.front import HearingConfig
from callcenter.hearing.stt import WhisperStt

__all__ = ["CallControl", "CallSession", "SessionResult", "HOLD_ON_TEXT", "STT_GIVE_UP_S", "unless_stalled",
           "recording_paths"]

log = structlog.get_logger()

SHUTDOWN_S = 1.0  # a stage still busy this long after the call ended is logged and left behind


class CallControl(Protocol):
    # True where a transfer keeps the agent in the media path (a browser caller cannot be REFERred):
    # after a blind transfer the call goes on, bridged, instead of ending
    transfer_bridges: bool

    async def hangup(self) -> None: ...
    async def transfer(self, uri: str) -> bool: ...
    async def warm_transfer(self, uri: str, summary: str, ring_s: float, speak) -> bool: ...
    # a wait in a queue of human agents, or None where no contact center is configured
    def queue_wait(self, queue: str, settings, whisper: str, speak) -> QueueWait | None: ...


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
    def __init__(self, call_id: str, flow: Flow, bridge: MediaBridge, control: CallControl, events: CallEvents,
                 stt: WhisperStt, tts, hearing: HearingConfig | None = None, services: FlowServices | None = None,
                 variables: dict | None = None, flow_digest: str | None = None, now=None, worker: str | None = None,
                 transport: str | None = None, backup_tts=None, transport_id: dict[str, str] | None = None):
        self.call_id, self.flow, self.bridge, self.control, self.events = call_id, flow, bridge, control, events
        self.origin = CallOrigin(flow_digest, worker, transport, transport_id or {})
        self.log = log.bind(call_id=call_id)
        self.dialog = Dialog(flow, variables={"call_id": call_id, **(variables or {})}, now=now)
        events.scrub = self.dialog.redactor.scrub  # card numbers and webhook keys never leave the call
        self.services = services or FlowServices(flow)
        self.result = SessionResult()
        self.ended = asyncio.Event()
        self.in_trouble = False  # a stage failed: the caller is being told and transferred or let go
        self.bridged = False  # a person has the caller (a warm transfer, a queue's agent)
        self.ending_by: str | None = None  # set when the agent starts ending the call itself
        # the parts, each with one job
        self.speaking = Speaking(self, tts, backup_tts)
        self.hearing = Hearing(self, stt, hearing)
        self.runner = FlowRunner(self)
        self.privacy = Privacy(self)
        self.voicemail = Voicemail(self)
        self.queue = QueueWaiting(self)
        self.transferring = Transferring(self)
        self.supervision = Supervision(self)
        self._tasks: list[asyncio.Task] = []  # the call's loops and stages: cancelled at its end
        self._side_tasks: set[asyncio.Task] = set()  # a turn's recognition, a key's decision: ended with the call

    # ------------------------------------------------------------ lifecycle
    async def run(self) -> SessionResult:
        o = self.origin
        self.events.emit(ev.CALL_START, flow=self.flow.name, flow_version=self.flow.version,
                         **({"flow_digest": o.flow_digest} if o.flow_digest else {}),
                         **({"worker": o.worker} if o.worker else {}),
                         **({"transport": o.transport} if o.transport else {}), **o.transport_id)
        for loop, name in ((self.hearing.run, "hear"), (self._perform, "speak")):
            task = asyncio.create_task(loop(), name=f"{self.call_id}-{name}")
            task.add_done_callback(self._stage_died)
            self._tasks.append(task)
        self.runner.act(self.dialog.start())
        self.privacy.guard()
        await self.ended.wait()
        await self._shutdown()
        return self.result

    def run_stage(self, coro) -> None:
        """A stage of the flow's (a webhook, a model turn): ended with the call."""
        self._tasks.append(asyncio.create_task(coro))

    def keep(self, task: asyncio.Task) -> asyncio.Task:
        """Hold a short task of this call until it is done (the loop keeps only weak references), and
        cancel it if the call ends first."""
        self._side_tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._side_tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                # a traceback in the log, an error event, and the caller hears the flow's trouble
                # path rather than silence
                self.log.error("task_failed", task=t.get_name(), error=repr(exc), exc_info=exc)
                self.events.emit(ev.ERROR, stage="task", task=t.get_name(), error=repr(exc))
                self.trouble("task")

        task.add_done_callback(done)
        return task

    def _stage_died(self, task: asyncio.Task) -> None:
        """A hearing or speaking loop that crashes would leave the caller in dead air: restart the
        speaking loop if it was that one, and take the trouble path (with everything recorded so far
        kept). A second crash while in trouble ends the call."""
        if task.cancelled() or task.exception() is None or self.ended.is_set():
            return
        exc = task.exception()
        stage = task.get_name().rsplit("-", 1)[-1]
        self.log.error("stage_failed", task=task.get_name(), error=repr(exc))
        self.events.emit(ev.ERROR, stage=stage, error=repr(exc))
        if self.in_trouble:
            self.end("error")
            return
        if stage == "speak":
            self.speaking.queue = asyncio.Queue()
            speaker = asyncio.create_task(self._perform(), name=f"{self.call_id}-speak")
            speaker.add_done_callback(self._stage_died)
            self._tasks.append(speaker)
        self.trouble(stage)

    def trouble(self, stage: str) -> None:
        """A part of the agent failed: stop the flow, tell the caller at once, then transfer them to
        the flow's `trouble.transfer_to` or ask them to call back and hang up."""
        if self.in_trouble or self.ended.is_set():
            return
        self.in_trouble = True
        to = trouble_destination(self.flow)
        self.log.warning("call_in_trouble", stage=stage, transfer_to=to)
        self.events.emit(ev.TROUBLE, stage=stage, transfer_to=to)
        self.speaking.interrupt(reason=f"{stage} failed")
        self.runner.cancel_no_input()
        t = self.flow.trouble
        if to is not None:
            self.runner.act([Say(f"{t.say} {t.transferring}"), Transfer(to=to, mode="blind")])
        else:
            self.runner.act([Say(f"{t.say} {t.call_back}"), Hangup()])

    def end(self, by: str) -> None:
        """The call is over (caller hung up, or the agent finished)."""
        if not self.ended.is_set():
            self.result.ended_by = self.ending_by or by
            self.ended.set()
            self.runner.call_ended()

    async def _shutdown(self) -> None:
        self.speaking.interrupt(reason="call ended", emit=False)
        self.runner.cancel_no_input()
        for t in self._tasks:
            if not t.done():
                t.cancel()
        busy = [t for t in self._tasks if not t.done()]
        if busy:
            _, stuck = await asyncio.wait(busy, timeout=SHUTDOWN_S)
            for t in stuck:  # the call still ends now; the stage's stack says what it was waiting on
                frames = [f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno} {f.f_code.co_name}"
                          for f in t.get_stack()]
                self.log.error("stage_stuck_at_end", task=t.get_name(), stack=frames)
        for t in self._tasks:
            if t.done() and not t.cancelled():
                t.exception()  # retrieved: a stage that failed while ending is not an unhandled error
        for t in list(self._side_tasks):
            t.cancel()
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
                await self.voicemail.record(action)
            elif isinstance(action, Transfer):
                if await self.transferring.carry_out(action):
                    return
            elif isinstance(action, Enqueue):
                if await self.queue.carry_out(action):
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
        return call_state(self).value

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
        from callcenter.dialog.engine import Waiting

        return self.speaking.speaking or self.runner.in_flight > 0 or self.hearing.listener.in_speech or \
            self.dialog.waiting in (Waiting.FETCH, Waiting.LLM)

    @property
    def recording_voicemail(self) -> bool:
        return self.voicemail.recording

    @property
    def held(self) -> bool:
        return self.supervision.held

    def interrupt(self, reason: str, emit: bool = True) -> None:
        self.speaking.interrupt(reason, emit)

    def on_dtmf(self, digit: str, source: str = "rfc4733") -> None:
        self.hearing.on_dtmf(digit, source)

    # the supervisor's controls (the control API's actions)
    def supervisor_say(self, text: str) -> None:
        self.supervision.say(text)

    def take_over(self) -> None:
        self.supervision.take_over()

    def release(self) -> None:
        self.supervision.release()

    def pause(self) -> None:
        self.supervision.pause()

    def supervisor_transfer(self, uri: str) -> None:
        self.supervision.transfer(uri)

    def supervisor_enqueue(self, queue: str) -> None:
        self.supervision.enqueue(queue)

    def supervisor_transfer_to_agent(self, name: str, uri: str) -> None:
        self.supervision.transfer_to_agent(name, uri)

    def supervisor_hangup(self, goodbye: str = SUPERVISOR_GOODBYE) -> None:
        self.supervision.hangup(goodbye)

    def mark(self, note: str) -> None:
        self.supervision.mark(note)

    @property
    def marked(self) -> str | None:
        return self.supervision.marked


def recording_paths(root: str | Path, call_id: str) -> tuple[Path, Path]:
    """Where a call is recorded: `<root>/<YYYY-MM-DD>/<call_id>.wav` and `.jsonl`. `call_id` is the
    server's own id (never a caller's Call-ID, which could name another folder)."""
    if not call_id or "/" in call_id or call_id.startswith("."):
        raise ValueError(f"not a call id to name files by: {call_id!r}")
    day = Path(root) / time.strftime("%Y-%m-%d")
    return day / f"{call_id}.wav", day / f"{call_id}.jsonl"
