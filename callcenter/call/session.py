"""One call's conversation: caller audio → turn taking → recognition → dialog → voice → playout.

`CallSession` assembles the stages and routes what each produces to the next, in one direction:
caller frames (with the agent frame of the same tick) → `LineFront` (echo canceller, noise gate) →
`TurnDetector` → `WhisperStt` (decodes while the caller pauses, so the text is often ready when the
turn ends) → `Dialog` → the voice → the media bridge. Barge-in is its own path: caller speech over
the agent holds the voice (`bridge.pause()`), and `interrupt()` stops it and drops queued audio at
once when the turn detector confirms a real interruption; a backchannel resumes it. The transport
(SIP or the offline simulator) only delivers frames, keypad digits and the end of the call, and
carries out transfer and hang-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from callcenter.audio.frames import SAMPLE_RATE, frames_from_pcm
from callcenter.audio.stage import Moment
from callcenter.call import events as ev
from callcenter.call.attendant import QueueWait
from callcenter.call.bridge import LineFrame, MediaBridge
from callcenter.call.events import CallEvents
from callcenter.call.speech import Speech, shorten_lead_in
from callcenter.call.voicemail import VoicemailRecorder, beep_frames, voicemail_path
from callcenter.dialog.engine import (
    Dialog,
    Enqueue,
    Fetch,
    Hangup,
    Listen,
    Record,
    Say,
    Silence,
    Think,
    Transfer,
    Waiting,
)
from callcenter.dialog.flow import DTMF_DIGITS, RECORDED, Flow, LlmNode, trouble_destination
from callcenter.dialog.redact import mask_spoken_digits
from callcenter.dialog.services import FlowServices
from callcenter.hearing.decoding import ENDED, PARTIAL, PAUSED, Decode, decode_executor
from callcenter.hearing.front import HearingConfig
from callcenter.hearing.listener import Key, Listener, Outcome
from callcenter.hearing.stt import WhisperStt
from callcenter.hearing.turns import BargeIn, Discarded, Ended, Expectation, Pause, Resume, Started, Turn
from callcenter.text.expecting import Expecting

log = structlog.get_logger()

STT_STALL_S = 1.0  # end of turn → transcript: past this the caller hears "one moment"
STT_GIVE_UP_S = 3.0  # past this the recognizer counts as stalled: the trouble path
TTS_FIRST_AUDIO_S = 0.8  # a voice with no first frame by then (or none for this long between frames)
TTS_FRAME_GAP_S = 1.0  # has stalled: the backup voice says the sentence
BACKUP_VOICE = "espeak:en-us"  # another engine entirely (espeak-ng), not another SSM voice
WAITING_ON_THE_AGENT = (Waiting.FETCH, Waiting.LLM, Waiting.RECORD, Waiting.TRANSFER)  # caller input waits
HOLD_ON_TEXT = "One moment, please."
GOODBYE_GRACE_S = 0.3  # let the last frame reach the caller before BYE/REFER
HOLD_UTTERANCE = -2  # the utterance number of hold music frames (no playout events)
HOLD_AHEAD_FRAMES = 8  # hold music queued ahead of the line (an announcement cuts in within 160 ms)
FIRST_ANNOUNCEMENT_S = 1.0  # music first, then where the caller is in line
KEY_TIMEOUT_S = 4.0  # a caller keying a digit string who stops this long has finished
SHUTDOWN_S = 1.0  # a stage still busy this long after the call ended is logged and left behind
PRIVATE_TAIL_S = 1.5  # the caller's side stays out of the recording this long after a card number is taken


async def unless_stalled(items, first_s: float, gap_s: float):
    """Yield from the async iterator `items`; TimeoutError if the first item takes longer than
    `first_s` or a later one longer than `gap_s`. `items` is closed however this ends.

    asyncio.timeout, not wait_for: Python 3.11's wait_for returns the item when a cancel arrives
    just as the item does, which would let a voice outlive a barge-in or the call itself."""
    wait = first_s
    try:
        while True:
            try:
                async with asyncio.timeout(wait):
                    item = await anext(items)
            except StopAsyncIteration:
                return
            yield item
            wait = gap_s
    finally:
        with contextlib.suppress(Exception):
            await items.aclose()


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


async def recorded_frames(pcm: bytes, burst: int = 50):
    """A recorded prompt's 20 ms frames, handed over in bursts as a cached sentence is."""
    for i, frame in enumerate(frames_from_pcm(pcm)):
        yield frame
        if i % burst == burst - 1:
            await asyncio.sleep(0)


SUPERVISOR_GOODBYE = "Thank you for calling. Goodbye."  # said before a supervisor's hang-up


class CallSession:
    def __init__(
        self,
        call_id: str,
        flow: Flow,
        bridge: MediaBridge,
        control: CallControl,
        events: CallEvents,
        stt: WhisperStt,
        tts,
        hearing: HearingConfig | None = None,
        services: FlowServices | None = None,
        variables: dict | None = None,
        flow_digest: str | None = None,
        now=None,
        worker: str | None = None,
        transport: str | None = None,
        backup_tts=None,
        transport_id: dict[str, str] | None = None,
    ):
        self.call_id = call_id
        self.flow = flow
        self.flow_digest = flow_digest
        self.worker = worker  # which agent process took the call (serve --workers)
        self.transport = transport  # sip, webrtc (None: a simulated line)
        self.transport_id = transport_id or {}  # the transport's own name for the call (sip_call_id)
        self.bridge = bridge
        self.control = control
        self.events = events
        self.stt = stt
        self._decoder = decode_executor(stt)  # shared by every call on this recognizer: ended turns first
        self.tts = tts
        self._backup_tts = backup_tts
        self.in_trouble = False  # a stage failed: the caller is being told and transferred or let go
        self.log = log.bind(call_id=call_id)
        self.dialog = Dialog(flow, variables={"call_id": call_id, **(variables or {})}, now=now)
        events.scrub = self.dialog.redactor.scrub  # card numbers and webhook keys never leave the call
        self._private_off: asyncio.TimerHandle | None = None
        self._turn_private = False  # the caller's current turn began while they gave a sensitive value
        self.services = services or FlowServices(flow)
        self._voicemail: VoicemailRecorder | None = None
        self.bridged = False  # a warm transfer connected the caller to a person
        self.held = False  # a supervisor took the call over (or paused it): the flow does not act
        self._heard_while_held = False  # the caller spoke to the supervisor: ask again on release
        self.paused = False
        self.marked: str | None = None
        self._supervisor_transfer = False
        self.queued: QueueWait | None = None  # waiting in a queue of agents: hold music, announcements
        self._queue_key: str | None = None
        self._speech_gen = 0  # bumped by every interruption: streamed model sentences of an older one are dropped
        self.hearing = hearing or HearingConfig()
        self.listener = Listener(self.hearing)
        self._decodes: dict[tuple[int, int], asyncio.Future] = {}  # the listener's Pause requests, running
        self.result = SessionResult()
        self._speak_queue: asyncio.Queue = asyncio.Queue()
        self._speeches = 0  # ids given so far
        self._agent_done_at: float | None = None  # when the agent's last Speech left the line (bridge clock)
        self.speech: Speech | None = None  # what the agent is saying now
        self._playing: dict[int, Speech] = {}  # speeches whose playout the bridge has not finished
        self._listen: Listen | None = None
        self._no_input_task: asyncio.Task | None = None
        self._ended = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._side_tasks: set[asyncio.Task] = set()  # a turn's recognition, a key's decision: ended with the call
        self._decide_lock = asyncio.Lock()
        self._flow_moved = asyncio.Event()  # the dialog took a step (caller input waiting on the agent retries)
        self._in_flight = 0  # caller turns heard but not yet answered
        self._ending_by: str | None = None  # set when the agent starts ending the call itself
        bridge.on_playout(self._first_frame_out, self._utterance_played, self._first_sound_out)

    # ------------------------------------------------------------ lifecycle
    async def run(self) -> SessionResult:
        self.events.emit(ev.CALL_START, flow=self.flow.name, flow_version=self.flow.version,
                         **({"flow_digest": self.flow_digest} if self.flow_digest else {}),
                         **({"worker": self.worker} if self.worker else {}),
                         **({"transport": self.transport} if self.transport else {}), **self.transport_id)
        self._tasks = [
            asyncio.create_task(self._hear(), name=f"{self.call_id}-hear"),
            asyncio.create_task(self._speak(), name=f"{self.call_id}-speak"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._stage_died)
        self._act(self.dialog.start())
        self._guard_privacy()
        await self._ended.wait()
        await self._shutdown()
        return self.result

    def _keep(self, task: asyncio.Task) -> asyncio.Task:
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
        if task.cancelled() or task.exception() is None or self._ended.is_set():
            return
        exc = task.exception()
        stage = task.get_name().rsplit("-", 1)[-1]
        self.log.error("stage_failed", task=task.get_name(), error=repr(exc))
        self.events.emit(ev.ERROR, stage=stage, error=repr(exc))
        if self.in_trouble:
            self.end("error")
            return
        if stage == "speak":
            self._speak_queue = asyncio.Queue()
            speaker = asyncio.create_task(self._speak(), name=f"{self.call_id}-speak")
            speaker.add_done_callback(self._stage_died)
            self._tasks.append(speaker)
        self.trouble(stage)

    def trouble(self, stage: str) -> None:
        """A part of the agent failed: stop the flow, tell the caller at once, then transfer them to
        the flow's `trouble.transfer_to` or ask them to call back and hang up."""
        if self.in_trouble or self._ended.is_set():
            return
        self.in_trouble = True
        to = trouble_destination(self.flow)
        self.log.warning("call_in_trouble", stage=stage, transfer_to=to)
        self.events.emit(ev.TROUBLE, stage=stage, transfer_to=to)
        self.interrupt(reason=f"{stage} failed")
        self._cancel_no_input()
        t = self.flow.trouble
        if to is not None:
            self._act([Say(f"{t.say} {t.transferring}"), Transfer(to=to, mode="blind")])
        else:
            self._act([Say(f"{t.say} {t.call_back}"), Hangup()])

    def end(self, by: str) -> None:
        """The call is over (caller hung up, or the agent finished)."""
        if not self._ended.is_set():
            self.result.ended_by = self._ending_by or by
            self._ended.set()
            self._flow_moved.set()

    async def _shutdown(self) -> None:
        self.interrupt(reason="call ended", emit=False)
        for t in self._tasks + [self._no_input_task]:
            if t and not t.done():
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

    @property
    def slot_names(self) -> set[str]:
        """The flow's slots: what the call's row keeps of its variables."""
        return {n for node in self.flow.nodes.values() for n in (getattr(node, "slots", None) or {})}

    # ------------------------------------------------------------ barge-in
    @property
    def utterances_spoken(self) -> int:
        return self._speeches

    @property
    def busy(self) -> bool:
        """The agent is talking or still working out its answer to the caller."""
        return self.agent_speaking or self._in_flight > 0 or self.listener.in_speech or \
            self.dialog.waiting in (Waiting.FETCH, Waiting.LLM)

    @property
    def recording_voicemail(self) -> bool:
        return self._voicemail is not None

    @property
    def agent_speaking(self) -> bool:
        return self.speech is not None or not self._speak_queue.empty() or self.bridge.queued_frames > 0

    def interrupt(self, reason: str, emit: bool = True) -> None:
        """Stop the agent's voice now: cancel synthesis, drop queued prompts and queued audio."""
        self._speech_gen += 1
        dropped = self.bridge.flush()
        self.bridge.resume()
        while not self._speak_queue.empty():
            self._speak_queue.get_nowait()
        if self.speech is not None:
            self.speech.interrupt()
            self._utterance_played(self.speech.id, self.bridge.clock())
        if emit:
            self.events.emit(ev.BARGE_IN, reason=reason, dropped_frames=dropped)

    # ------------------------------------------------------------ hearing
    async def _hear(self) -> None:
        while True:
            line: LineFrame = await self.bridge.caller_frames.get()
            now = self.events.now()
            if self.bridged:  # a person has the caller now: keep recording, stop listening
                continue
            if self.queued is not None:  # on hold: only the keypad (tones too) is heard
                for outcome in self.listener.process(line.caller, Moment(now, line.played, agent_talking=True)):
                    if isinstance(outcome, Key):
                        self._on_key(outcome)
                continue
            if self._voicemail is not None:
                self._voicemail.add(line.caller.pcm, agent_talking=self.agent_speaking)
            talking = self.agent_speaking and not self.dialog.finished
            for outcome in self.listener.process(line.caller, Moment(now, line.played, agent_talking=talking)):
                self._carry_out(outcome, now)

    def _carry_out(self, event: Outcome, now: float) -> None:
        """Do what the listener's outcome asks of the call."""
        if isinstance(event, Key):
            self._on_key(event)
            return
        if self._voicemail is not None:  # a message being left is recorded, not answered
            self._voicemail.heard(event, now)
            return
        if isinstance(event, Started):
            self._turn_private = self.bridge.private_caller or self.dialog.collecting_sensitive
            self._cancel_no_input()
            self.events.next_turn()  # the turn's partials, final and answer share its number
            self.events.emit(ev.SPEECH_START, over_agent=event.agent_talking, floor_db=round(self.listener.floor_db, 1))
            if event.agent_talking:
                self.bridge.pause()
                self.events.emit(ev.AGENT_PAUSED, reason="caller speech")
        elif isinstance(event, Pause):
            self._start_decode(event)
        elif isinstance(event, BargeIn):
            self.interrupt(reason=event.reason)
        elif isinstance(event, Resume):
            self.bridge.resume()
            self.events.emit(ev.AGENT_RESUMED, reason=event.reason)
        elif isinstance(event, Discarded):
            self.events.emit(ev.SPEECH_IGNORED, reason=event.reason)
        elif isinstance(event, Ended):
            turn = event.turn
            if self.bridge.paused:  # spoke over the agent and it counted: the agent has been interrupted
                self.bridge.resume()
            self.events.emit(ev.SPEECH_END, audio_s=round(turn.seconds, 3), silence_ms=round(event.silence_ms),
                             last_voice_t=round(now - event.silence_ms / 1000, 4), why=event.why)
            self._in_flight += 1
            self._keep(asyncio.create_task(self._recognise(turn, self._turn_private)))

    def _start_decode(self, pause: Pause) -> None:
        if (pause.recheck or pause.partial and not pause.over_agent) and self._decoder.busy:
            # a look for the console, or a second look at a pause already decoded: not while other
            # calls' decodes need the recognizer
            self.listener.declined(pause.turn_id, pause.key)
            return
        key = (pause.turn_id, pause.key)
        loop = asyncio.get_running_loop()
        expect = self.listener.expect
        if pause.partial:
            decode = Decode(PARTIAL, self.stt.transcribe_pcm, stream=(self.call_id, pause.turn_id))
        else:  # skipped if the caller has gone on talking by the time the recognizer gets to it
            decode = Decode(PAUSED, self.stt.transcribe_pcm, stream=(self.call_id, pause.turn_id),
                            wanted=lambda: not self.listener.outdated(*key))
        future = loop.run_in_executor(self._decoder, decode, pause.pcm, SAMPLE_RATE, None, expect)
        self._decodes[key] = future
        for old in [k for k in self._decodes if k[0] < pause.turn_id - 1]:
            del self._decodes[old]

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None or self._ended.is_set():
                return
            result = f.result()
            self.events.emit(ev.STT_PARTIAL, text=self._shown(result.text), confidence=round(result.confidence, 3),
                             audio_s=round(result.audio_s, 2), stt_s=round(result.seconds, 3), partial=pause.partial,
                             recheck=pause.recheck)
            now = self.events.now()
            for event in self.listener.decoded(pause.turn_id, pause.key, result.text, result.confidence,
                                               result.guessed):
                self._carry_out(event, now)
            if not pause.partial and expect.finished is not None and result.text.strip() and self.listener.in_speech:
                self._judge(pause, expect.finished, result.text)

        future.add_done_callback(done)

    def _judge(self, pause: Pause, finished, text: str) -> None:
        """Does the pause's text read as a finished sentence? (A language model: on a worker thread.)"""
        t0 = self.events.now()
        judging = asyncio.get_running_loop().run_in_executor(None, finished, text)

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None or self._ended.is_set():
                return
            now = self.events.now()
            self.events.emit(ev.TURN_JUDGED, finished=f.result(), ms=round((now - t0) * 1000))
            for event in self.listener.judged(pause.turn_id, pause.key, f.result()):
                self._carry_out(event, now)

        judging.add_done_callback(done)

    async def _recognise(self, turn: Turn, private: bool = False) -> None:
        try:
            stream = (self.call_id, turn.turn_id)
            if turn.text is not None:
                text, conf, stt_s, how = turn.text, turn.confidence, 0.0, "early"
                self._cancel_looks(turn.turn_id)
            else:
                covering = self.listener.covering(turn)
                if covering is not None and covering in self._decodes:
                    decode, how = self._decodes[covering], "in flight"
                    self._decoder.hurry(stream)  # the caller waits for it now
                else:
                    expect = self.listener.expect
                    decode = asyncio.get_running_loop().run_in_executor(
                        self._decoder, Decode(ENDED, self.stt.transcribe_pcm, stream=stream),
                        turn.pcm, SAMPLE_RATE, None, expect)
                    how = "after end"
                self._cancel_looks(turn.turn_id, but=decode)
                result = await self._await_transcript(decode)
                text, conf, stt_s = result.text, result.confidence, result.seconds
            self.events.emit(ev.STT_FINAL, text=self._shown(text, private), confidence=round(conf, 3),
                             stt_s=round(stt_s, 3),
                             via=how)
        except Exception as exc:  # a recognizer that raises or stalls: tell the caller, don't go silent
            error = str(exc) or f"no transcript after {STT_GIVE_UP_S} s"
            self.log.error("stt_failed", error=error)
            self.events.emit(ev.ERROR, stage="stt", error=error)
            self._in_flight = max(0, self._in_flight - 1)
            self.trouble("stt")
            return
        if self.held:  # the supervisor has the call: heard and logged, not answered
            self._in_flight = max(0, self._in_flight - 1)
            self._heard_while_held = self._heard_while_held or bool(text)
            return
        await self._decide(lambda: self.dialog.on_utterance(text, conf) if text else self.dialog.on_no_input())

    def _cancel_looks(self, turn_id: int, but: asyncio.Future | None = None) -> None:
        """The turn has its text or the decode that gives it: other looks at it no one needs now."""
        for key, other in list(self._decodes.items()):
            if key[0] == turn_id and other is not but and not other.done():
                other.cancel()

    async def _await_transcript(self, decode: asyncio.Future):
        """The decode's result; "one moment" to the caller if it is slow, TimeoutError if stalled."""
        try:  # shielded: a timeout gives up waiting, not the decode
            async with asyncio.timeout(STT_STALL_S):
                return await asyncio.shield(decode)
        except TimeoutError:
            if not self.agent_speaking:
                self.events.emit(ev.STAGE_SLOW, stage="stt", after_s=STT_STALL_S)
                self._act([Say(HOLD_ON_TEXT)])
        async with asyncio.timeout(STT_GIVE_UP_S - STT_STALL_S):
            return await asyncio.shield(decode)

    def on_dtmf(self, digit: str, source: str = "rfc4733") -> None:
        """A keypad digit from signalling (RFC 4733 telephone events, the browser's keypad channel).
        A peer that also sends it as a tone gets one digit (the listener drops the second)."""
        key = self.listener.key(digit, source, self.events.now())
        if key is not None:
            self._on_key(key)

    def _on_key(self, key: Key) -> None:
        digit, source = key.digit, key.source
        self.events.next_turn()
        if digit not in DTMF_DIGITS:  # A-D: a tone no telephone keypad sends to us
            self.events.emit(ev.DTMF, digit=digit, source=source, ignored=True)
            return
        if not self.dialog.collecting_sensitive:  # a card number's keys are not logged one by one
            self.events.emit(ev.DTMF, digit=digit, source=source)
        if self._voicemail is not None:
            if digit == "#":
                self._voicemail.finish("pound")
            return
        if self.queued is not None:  # in a queue only the callback key means anything
            if digit == self._queue_key:
                self.queued.leave("callback")
            return
        self._cancel_no_input()
        if self.dialog.finished or self.held:
            return
        if self.agent_speaking:
            self.interrupt(reason="keypad")
        self._in_flight += 1
        self._keep(asyncio.create_task(self._decide(lambda: self.dialog.on_dtmf(digit))))

    async def _decide(self, step, caller_input: bool = True) -> None:
        """Run one engine step. Caller input (counted in `_in_flight`) waits while the flow waits for
        a webhook, a model, a voicemail or a transfer; those results themselves go straight in."""
        try:
            while caller_input and self.dialog.waiting in WAITING_ON_THE_AGENT and not self._ended.is_set():
                self._flow_moved.clear()
                await self._flow_moved.wait()  # set by every engine step, and when the call ends
            await self._decide_locked(step)
        finally:
            if caller_input:
                self._in_flight = max(0, self._in_flight - 1)

    async def _decide_locked(self, step) -> None:
        try:
            await self._step(step)
        finally:
            self._flow_moved.set()

    async def _step(self, step) -> None:
        async with self._decide_lock:
            if self.dialog.finished or self._ended.is_set() or self.in_trouble:
                return
            try:
                actions = step()
            except Exception as exc:
                self.log.error("flow_failed", error=str(exc))
                self.events.emit(ev.ERROR, stage="flow", error=str(exc))
                self.trouble("flow")
                return
            self._guard_privacy()
            d = self.dialog.last_decision
            fields = {"node": d.node, "intent": d.intent, "score": round(d.score, 3), "via": d.via,
                      "next_node": self.dialog.node_name}
            if d.value is not None:
                fields["value"] = d.value
            for name, value in d.detail.items():  # the flow's own names (slots) never displace ours
                fields[name if name not in fields and name not in ev.EVENT_FIELDS else f"slot_{name}"] = value
            self.events.emit(ev.FLOW_DECISION, **fields)
            self._act(actions)
            if not actions and self.dialog.collecting_keys:
                self._start_no_input(KEY_TIMEOUT_S)  # between keys of a digit string

    # ------------------------------------------------------------ acting
    def _act(self, actions) -> None:
        for action in actions:
            if isinstance(action, Fetch):
                self._tasks.append(asyncio.create_task(self._fetch(action)))
                continue
            if isinstance(action, Think):
                self._tasks.append(asyncio.create_task(self._think(action)))
                continue
            if isinstance(action, Listen):
                self._listen = action
                self._expect(action)
            self._speak_queue.put_nowait(action)

    async def _fetch(self, action: Fetch) -> None:
        self.events.emit(ev.WEBHOOK, node=action.node, url=action.url, method=action.method)
        result = await self.services.fetch(action, self.log, self.dialog.redactor.scrub)
        self.events.emit(ev.WEBHOOK, node=action.node, status=result.status, ms=round(result.seconds * 1000),
                         **({"error": result.error} if result.error else {}))
        await self._decide(lambda: self.dialog.on_fetched(result.status, result.data, result.error), caller_input=False)

    async def _think(self, action: Think) -> None:
        request = action.request
        gen = self._speech_gen
        self.events.emit(ev.LLM_REQUEST, node=request.node, provider=request.provider, text=request.utterance)

        def sentence(text: str) -> None:
            if gen == self._speech_gen and not self._ended.is_set():
                self._speak_queue.put_nowait(Say(text))

        result = await self.services.think(action, sentence, self.log)
        self.events.emit(ev.LLM_REPLY, node=request.node, ms=round(result.seconds * 1000),
                         first_sentence_ms=round(result.first_text_s * 1000) if result.first_text_s else None,
                         text=result.reply.text if result.reply else None,
                         **({"via": result.reply.via} if result.reply is not None and result.reply.via else {}),
                         **({"error": result.error} if result.error else {}))
        await self._decide(lambda: self.dialog.on_thought(result.reply, result.error), caller_input=False)

    def _expect(self, listen: Listen) -> None:
        node = self.dialog.node
        finished = self.services.end_of_turn(node.provider) \
            if listen.kind == Expecting.SPEECH and isinstance(node, LlmNode) else None
        self.listener.expecting(Expectation(listen.kind, listen.end_silence_ms, listen.digits_min, listen.digits_max,
                                         answers=self.dialog.would_answer, finished=finished))

    async def _speak(self) -> None:
        """Carries out actions in order: speaks prompts, then listens, transfers or hangs up."""
        while True:
            action = await self._speak_queue.get()
            if isinstance(action, Say):
                await self._say(action.text, action.voice, action.private, action.audio)
            elif isinstance(action, Silence):
                await asyncio.sleep(action.ms / 1000)
            elif isinstance(action, Listen):
                self._start_no_input(action.timeout_s)
            elif isinstance(action, Record):
                await self._record(action)
            elif isinstance(action, Transfer):
                await asyncio.sleep(GOODBYE_GRACE_S)
                self._ending_by = "transfer"
                self.events.emit(ev.TRANSFER, to=action.to, mode=action.mode)
                if action.mode == "warm":
                    ok = await self.control.warm_transfer(action.to, action.summary, action.ring_s, self._brief)
                else:
                    ok = await self.control.transfer(action.to)
                self.events.emit(ev.TRANSFER, to=action.to, mode=action.mode, accepted=ok)
                if ok:
                    self.result.transferred_to = action.to
                    # bridged (warm, or any transfer of a caller that cannot be REFERred): the call goes
                    # on until either side hangs up
                    if action.mode == "warm" or self.control.transfer_bridges:
                        self.bridged = True
                        return
                    self.end("transfer")
                    return
                self._ending_by = None
                if self.in_trouble:  # nobody to take the caller: ask them to call back
                    self._act([Say(self.flow.trouble.call_back), Hangup()])
                    continue
                if self._supervisor_transfer:  # the supervisor's own transfer failed: the flow carries on
                    self._supervisor_transfer = False
                    continue
                await self._decide(self.dialog.on_transfer_failed, caller_input=False)
            elif isinstance(action, Enqueue):
                if await self._wait_in_queue(action):
                    return
            elif isinstance(action, Hangup):
                await asyncio.sleep(GOODBYE_GRACE_S)
                self._ending_by = "agent"
                self.events.emit(ev.HANGUP, by="agent")
                await self.control.hangup()
                self.end("agent")
                return
            else:  # a new action kind nobody taught this loop: say so instead of dropping it silently
                self.log.error("unknown_action", action=repr(action))

    async def _wait_in_queue(self, action: Enqueue) -> bool:
        """Wait in a queue of agents with music and announcements until an agent is connected
        (True: the call goes on, bridged), or the wait ends otherwise and the flow decides."""
        settings = action.settings
        self._ending_by = "transfer"
        wait = self.control.queue_wait(action.queue, settings, action.whisper, self._brief)
        if wait is None:
            self.log.error("queue_unavailable", queue=action.queue,
                           error="no contact_center in the server config: nobody can answer a queue")
            result = "unavailable"
        else:
            self.queued, self._queue_key = wait.start(), settings.callback_key
            music = self._keep(asyncio.create_task(self._hold_music(), name="hold_music"))
            announcer = self._keep(asyncio.create_task(self._announce(wait, settings), name="queue_announcer"))
            try:
                async with asyncio.timeout(settings.max_wait_s):
                    result = await asyncio.shield(wait.result)
            except TimeoutError:
                wait.leave("timeout")
                result = "timeout"
            finally:
                announcer.cancel()
                music.cancel()
                if not wait.result.done():  # the call ended while waiting: the caller hung up
                    wait.leave("abandoned")
                self.queued = self._queue_key = None
            if self.speech is not None:  # an announcement cut short by the end of the wait
                self.interrupt(reason="queue", emit=False)
            self.bridge.flush()
        self.dialog.variables["queue_result"] = result
        if result == "answered":
            self.result.transferred_to = f"queue:{action.queue}/{wait.agent.name}"
            self.events.emit(ev.TRANSFER, to=wait.agent.uri, queue=action.queue, agent=wait.agent.name,
                             mode="queue", accepted=True)
            self.bridged = True
            return True
        self._ending_by = None
        if self._supervisor_transfer:  # the supervisor queued the caller; unanswered, the flow carries on
            self._supervisor_transfer = False
            return False
        await self._decide(lambda: self.dialog.on_queue_left(result), caller_input=False)
        return False

    async def _hold_music(self) -> None:
        """The music loop, a few frames ahead of the line; quiet while an announcement plays."""
        from callcenter.voice.hold_music import hold_music

        settings = self.queued.settings
        pcm = RECORDED.get(settings.music) if settings.music != "generated" else None
        frames = list(frames_from_pcm(pcm or hold_music()))
        i = 0
        while True:
            if self.speech is None and self.bridge.queued_frames < HOLD_AHEAD_FRAMES:
                for _ in range(HOLD_AHEAD_FRAMES - self.bridge.queued_frames):
                    self.bridge.play(frames[i % len(frames)], HOLD_UTTERANCE)
                    i += 1
            await asyncio.sleep(0.06)

    async def _announce(self, wait: QueueWait, settings) -> None:
        """Position and expected wait: soon after joining, then every announce_every_s."""
        first = True
        await asyncio.sleep(FIRST_ANNOUNCEMENT_S)
        while settings.announce_every_s or first:
            place, total, wait_s = wait.position()
            if place:
                self.dialog.variables.update(queue_position=place, queue_wait_s=round(wait_s),
                                             queue_wait_minutes=max(1, round(wait_s / 60)))
                self.events.emit(ev.QUEUE, what="position", queue=wait.queue, position=place, waiting=total,
                                 expected_wait_s=round(wait_s))
                text = self.dialog.render(settings.announcement)
                if first and settings.callback_key:
                    text += " " + settings.callback_offer
                self.bridge.flush()  # the music stops for the announcement
                await self._say(text)
            first = False
            if not settings.announce_every_s:
                return
            await asyncio.sleep(settings.announce_every_s)

    def _new_speech(self, text: str = "", voice=None, private: bool = False) -> Speech:
        self._speeches += 1
        speech = Speech(self._speeches, text, voice, private)
        self._playing[speech.id] = speech
        return speech

    async def _say(self, text: str, voice=None, private: bool = False, audio: str | None = None) -> None:
        speech = self.speech = self._new_speech(text, voice or self.flow.voice, private)
        speech.audio = audio
        self.events.emit(ev.AGENT_SAY, text=text, utterance=speech.id, voice=speech.voice.name)
        self.listener.agent_saying(text)
        speech.synthesis = asyncio.create_task(self._synthesise(speech))
        try:
            await speech.synthesis
        except asyncio.CancelledError:
            if self._ended.is_set():
                raise
        except Exception as exc:
            self.log.error("tts_failed", error=str(exc))
            self.events.emit(ev.ERROR, stage="tts", error=str(exc))
            self.bridge.end_utterance(speech.id)
        await speech.played
        self.speech = None

    async def _synthesise(self, speech: Speech) -> None:
        """A private speech says a sensitive value in full; it is synthesised for this call alone
        (never cached) and recorded as silence."""
        text, utt, voice, private = speech.text, speech.id, speech.voice, speech.private
        try:
            if speech.audio is not None and speech.audio in RECORDED:  # a voice talent's recording
                frames = recorded_frames(RECORDED[speech.audio])
            elif private:
                frames = self.tts.stream(text, voice, cache=False)
            else:
                frames = self.tts.stream(text, voice)
            await self._voice_into(frames, utt, private)
        except Exception as exc:  # the voice raised or stalled: the backup engine says the sentence
            error = str(exc) or f"no audio within {TTS_FIRST_AUDIO_S} s"
            self.log.error("tts_failed", error=error, fallback=BACKUP_VOICE)
            self.events.emit(ev.ERROR, stage="tts", error=error)
            self.events.emit(ev.STAGE_FALLBACK, stage="tts", to=BACKUP_VOICE)
            await self._voice_into(self.backup_tts.stream(text), utt, private)
        self.bridge.end_utterance(utt)

    async def _voice_into(self, frames, utt: int, private: bool = False) -> None:
        """Queue a voice's frames for playout, its opening silence shortened by the silence already
        on the line (`shorten_lead_in`); TimeoutError if it stalls (first frame, or a gap)."""
        first = True
        quiet_s = math.inf if self._agent_done_at is None else max(0.0, self.bridge.clock() - self._agent_done_at)
        frames = shorten_lead_in(unless_stalled(frames, TTS_FIRST_AUDIO_S, TTS_FRAME_GAP_S), quiet_s)
        async with contextlib.aclosing(frames) as voiced:
            async for frame in voiced:
                if first:
                    self.events.emit(ev.TTS_FIRST_AUDIO, utterance=utt)
                self.bridge.play(frame, utt, first=first, private=private)
                first = False

    @property
    def backup_tts(self):
        if self._backup_tts is None:
            self._backup_tts = backup_speaker()
        return self._backup_tts

    def _first_frame_out(self, utt: int, at: float) -> None:
        self.events.emit_at(ev.FIRST_RTP_OUT, self.events.since_start(at), utterance=utt)

    def _first_sound_out(self, utt: int, at: float) -> None:
        self.events.emit_at(ev.FIRST_SOUND_OUT, self.events.since_start(at), utterance=utt)

    def _utterance_played(self, utt: int, at: float) -> None:
        self._agent_done_at = at
        speech = self._playing.pop(utt, None)
        if speech is not None and speech.finish():
            self.events.emit(ev.PLAYOUT_DONE, utterance=utt)

    async def _brief(self, bridge, text: str) -> None:
        """Speak `text` into another leg (the person a warm transfer goes to) and wait until it has
        been played out."""
        self.events.emit(ev.TRANSFER_SUMMARY, text=text)
        played = asyncio.get_running_loop().create_future()
        bridge.on_playout(lambda utt, at: None, lambda utt, at: played.done() or played.set_result(at))
        first = True
        async for frame in self.tts.stream(text, self.flow.voice):
            bridge.play(frame, 1, first=first)
            first = False
        bridge.end_utterance(1)
        await played  # the leg's own playout says when its last frame has gone

    async def _record(self, action: Record) -> None:
        """Leave a message: a beep, then the caller's audio until # / silence / the maximum length."""
        if action.beep:
            beep = self._new_speech("(beep)")
            for i, frame in enumerate(beep_frames()):
                self.bridge.play(frame, beep.id, first=i == 0)
            self.bridge.end_utterance(beep.id)
            await beep.played
        path = voicemail_path(self.events.path, self.call_id)
        self._voicemail = VoicemailRecorder(path, action.max_s, action.end_silence_s)
        self.events.emit(ev.VOICEMAIL, state="recording", path=str(path) if path else None)
        try:
            reason = await self._voicemail.done()
        finally:
            recorder, self._voicemail = self._voicemail, None
            seconds = recorder.close()
        if not recorder.heard_speech:  # the file is kept, but the flow learns that nothing was said
            reason, seconds = "nothing said", 0.0
        self.events.emit(ev.VOICEMAIL, state="saved", path=str(path) if path else None, seconds=round(seconds, 2),
                         ended_by=reason)
        await self._decide(lambda: self.dialog.on_recorded(str(path) if path else None, seconds), caller_input=False)

    # ------------------------------------------------------------ sensitive values (PCI DSS)
    def _shown(self, text: str, private: bool = False) -> str:
        """What the caller said, as it may be stored: masked while they give a sensitive value, and
        in a turn that began then (a caller still reading out digits after the value was taken)."""
        if private or self._turn_private or self.dialog.collecting_sensitive:
            return mask_spoken_digits(text)
        return text

    def _guard_privacy(self) -> None:
        """Silence the caller's side of the recording while the flow collects a sensitive value,
        and for PRIVATE_TAIL_S after (a keypad tone or a last word still on the line)."""
        if self.dialog.collecting_sensitive:
            if self._private_off is not None:
                self._private_off.cancel()
                self._private_off = None
            self.bridge.private_caller = True
        elif self.bridge.private_caller and self._private_off is None:
            def off() -> None:
                self._private_off = None
                if self.dialog.collecting_sensitive:
                    return
                if self._turn_private and self.listener.in_speech:  # still reading digits out: wait
                    self._private_off = asyncio.get_running_loop().call_later(PRIVATE_TAIL_S, off)
                    return
                self.bridge.private_caller = False

            self._private_off = asyncio.get_running_loop().call_later(PRIVATE_TAIL_S, off)

    # ------------------------------------------------------------ supervisor
    @property
    def state(self) -> str:
        """What the call is doing, for the supervisor's table."""
        if self._ended.is_set():
            return "ended"
        if self.bridged:
            return "bridged"
        if self.paused:
            return "paused"
        if self.held:
            return "taken over"
        if self.queued is not None:
            return "queued"
        if self.dialog.waiting == Waiting.TRANSFER:
            return "transferring"
        if self._voicemail is not None:
            return "voicemail"
        if self.agent_speaking:
            return "talking"
        return "listening" if self.dialog.waiting == Waiting.CALLER else "working"

    def supervisor_say(self, text: str) -> None:
        """Speak a sentence the supervisor typed, in the call's voice, now: what the agent was saying
        stops. The flow goes on afterwards unless the call is taken over."""
        self.interrupt(reason="supervisor", emit=False)
        self.events.emit(ev.SUPERVISOR, action="say", text=text)
        self._speak_queue.put_nowait(Say(text))

    def take_over(self) -> None:
        """The supervisor has the call: the agent stops talking and the flow stops deciding (the
        caller is still heard and transcribed) until `release()`."""
        self.held = True
        self._cancel_no_input()
        self.interrupt(reason="supervisor", emit=False)
        self.events.emit(ev.SUPERVISOR, action="take_over")

    def release(self) -> None:
        self.held = self.paused = False
        self.bridge.resume()
        self.events.emit(ev.SUPERVISOR, action="release")
        heard, self._heard_while_held = self._heard_while_held, False
        if self.dialog.waiting == Waiting.CALLER and self._listen is not None and not self.agent_speaking:
            if heard:  # not "I didn't hear anything": the caller was talking to the supervisor
                self._keep(asyncio.create_task(self._decide(self.dialog.on_resume, caller_input=False)))
            else:
                self._start_no_input(self._listen.timeout_s)

    def pause(self) -> None:
        """Freeze the agent where it is (its voice held mid-word, the flow holding)."""
        self.paused = self.held = True
        self._cancel_no_input()
        self.bridge.pause()
        self.events.emit(ev.SUPERVISOR, action="pause")

    def supervisor_transfer(self, uri: str) -> None:
        """Blind transfer now. If the caller's phone refuses it, the call goes on where it was."""
        self.interrupt(reason="supervisor", emit=False)
        self.held = self.paused = False
        self._supervisor_transfer = True
        self.events.emit(ev.SUPERVISOR, action="transfer", to=uri)
        self._speak_queue.put_nowait(Transfer(uri))

    def supervisor_enqueue(self, queue: str) -> None:
        """Put the caller in one of the flow's queues of agents now (the console's transfer to a
        queue). If nobody answers before its max wait, the flow carries on where it was."""
        settings = self.flow.queues[queue]
        self.interrupt(reason="supervisor", emit=False)
        self.held = self.paused = False
        self._supervisor_transfer = True
        self.dialog.variables.update(queue=queue, triage=self.dialog.triage())
        self.events.emit(ev.SUPERVISOR, action="transfer", queue=queue)
        self._speak_queue.put_nowait(Enqueue(queue, settings, self.dialog.render(settings.whisper)))

    def supervisor_transfer_to_agent(self, name: str, uri: str) -> None:
        """Hand the caller to one human agent now: the agent calls them, tells them the triage
        summary, then bridges (a warm transfer). If they do not answer, the flow carries on."""
        self.interrupt(reason="supervisor", emit=False)
        self.held = self.paused = False
        self._supervisor_transfer = True
        self.events.emit(ev.SUPERVISOR, action="transfer", agent=name, to=uri)
        summary = f"A caller the supervisor is passing to you. {self.dialog.triage()}"
        self._speak_queue.put_nowait(Transfer(uri, "warm", summary, 20.0))

    def supervisor_hangup(self, goodbye: str = SUPERVISOR_GOODBYE) -> None:
        """End the call from the console: the caller hears a goodbye first, never a line gone dead."""
        self.interrupt(reason="supervisor", emit=False)
        self.dialog.finished = True
        self.events.emit(ev.SUPERVISOR, action="hangup")
        if goodbye:
            self._speak_queue.put_nowait(Say(goodbye))
        self._speak_queue.put_nowait(Hangup())

    def mark(self, note: str) -> None:
        self.marked = note or "marked"
        self.events.emit(ev.MARKED, note=self.marked)

    # ------------------------------------------------------------ no input
    def _start_no_input(self, timeout_s: float) -> None:
        self._cancel_no_input()
        self._no_input_task = asyncio.create_task(self._no_input_after(timeout_s))

    def _cancel_no_input(self) -> None:
        if self._no_input_task and not self._no_input_task.done():
            self._no_input_task.cancel()
        self._no_input_task = None

    async def _no_input_after(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)
        if not self.listener.in_speech and not self.held:
            self.events.next_turn()
            self._in_flight += 1
            await self._decide(self.dialog.on_no_input)


_BACKUP_SPEAKER = None


def backup_speaker():
    """The voice of last resort, shared by the process's calls: espeak-ng, another engine than the
    flows' SSM voices, so what breaks one is unlikely to break the other."""
    global _BACKUP_SPEAKER
    if _BACKUP_SPEAKER is None:
        from callcenter.voice.speaker import make_tts

        _BACKUP_SPEAKER = make_tts(BACKUP_VOICE)
    return _BACKUP_SPEAKER


def recording_paths(root: str | Path, call_id: str) -> tuple[Path, Path]:
    """Where a call is recorded: `<root>/<YYYY-MM-DD>/<call_id>.wav` and `.jsonl`. `call_id` is the
    server's own id (never a caller's Call-ID, which could name another folder)."""
    if not call_id or "/" in call_id or call_id.startswith("."):
        raise ValueError(f"not a call id to name files by: {call_id!r}")
    day = Path(root) / time.strftime("%Y-%m-%d")
    return day / f"{call_id}.wav", day / f"{call_id}.jsonl"
