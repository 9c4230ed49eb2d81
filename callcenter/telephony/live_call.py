"""A caller's call on a live transport, whatever carries it: the `CallSession` with its recording,
events and media bridge, and the `CallControl` (`call/ports.py`) the session uses. The SIP and
WebRTC calls (`sip_call.py`, `webrtc_call.py`) say how to hang up, transfer and connect a
person's leg on their transport; `ConsultLeg` is the agent's own call to a person (a warm
transfer, a queue's agent) and `SupervisorLeg` a supervisor's phone on the call.

A live call reaches the server that owns it only through `Switchboard`, the few things it needs."""

from __future__ import annotations

import asyncio
import contextvars
import time
import uuid
import zlib
from typing import Protocol

import structlog

from callcenter.call import events as ev
from callcenter.call.attendant import QueueWait
from callcenter.call.bridge import MediaBridge
from callcenter.call.call_row import CallRow
from callcenter.call.events import CallEvents
from callcenter.call.outcome import call_end
from callcenter.call.recording import StereoRecorder, unique_path
from callcenter.call.session import CallSession, recording_paths
from callcenter.dialog.flow import sensitive_variables
from callcenter.telephony.sip import SUPERVISION_MODES, SipCall, SipError
from callcenter.voice.ambience import Ambience

log = structlog.get_logger()

MEDIA_STALL_S = 5.0  # a live call whose transport asked for no frame this long is hung up
MEDIA_UP_S = 2.0  # a person's leg (warm transfer, queue agent, supervisor) whose audio is not up this long after answering fails
SUPERVISOR_RING_S = 30.0  # the supervisor's own phone rings this long before joining is given up


def new_call_id(transport: str) -> str:
    """The server's own name for a call: unique, and safe as a file name whatever the caller sent
    (the SIP Call-ID is kept in `call_start` as `sip_call_id`)."""
    return f"{transport}-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:12]}"


def caller_variables(remote: str) -> dict[str, str]:
    """`"Dana" <sip:4155550100@pbx.example>;tag=x` → caller sip:4155550100@pbx.example,
    caller_number 4155550100."""
    import re

    m = re.search(r"(sips?:[^>;\s]+)", remote)
    uri = m.group(1) if m else remote.strip()
    user = uri.split(":", 1)[-1].split("@", 1)[0] if "@" in uri else ""
    return {"caller": uri, "caller_number": user}

class Switchboard(Protocol):
    """What a live call needs from the server that owns it (`server.CallServer`)."""

    config: object  # ServerConfig: listen address, recordings folder, max calls
    flows: object  # FlowLibrary: the flow a new call runs
    stt: object  # the recognizer every call shares
    tts: object  # the voices
    metrics: object  # CallMetrics
    calls: object  # CallRecords: the calls table
    outbox: object  # writes waiting for the store
    endpoint: object  # SipEndpoint
    webrtc: object  # the WebRTC gateway, or None
    queues: object  # QueueStore, or None without a contact center
    control: object  # the control API, or None
    memory: object  # MemoryKeeper
    post_call: object  # PostCall: an ended call's summary and webhook
    live: dict  # call id → LiveCall

    def services_for(self, flow) -> object: ...
    def free_slots(self) -> int: ...
    def full(self, exclude=None) -> bool: ...
    def center_event(self, kind: str, **data) -> None: ...


class LiveCall:
    """One caller's call, whatever carries it: the CallSession with its recording, events and media
    bridge, and the CallControl the session uses. `SipLiveCall` and `WebRtcLiveCall` say how to
    hang up, transfer and connect a person's leg on their transport."""

    transport = "sip"
    direction = "inbound"  # outbound: a call the server placed (telephony/outbound.py)
    transfer_bridges = False  # True: a transfer keeps the agent in the media path (no REFER possible)

    def __init__(self, agent: Switchboard, call_id: str, remote_uri: str, variables: dict[str, str],
                 transport_id: dict[str, str] | None = None, library=None):
        self.agent = agent
        self.call_id = call_id
        self.remote_uri = remote_uri
        self.caller_id = dict(variables)  # caller, caller_number: the row's caller ID
        self.row: CallRow | None = None  # the call's row in the store, from the moment media flows
        self.log = log.bind(call_id=self.call_id)  # for callbacks from the transport's thread
        # everything the call's task runs (the session, webhooks, models, and tasks they start) logs
        # with call_id without being handed a logger
        self.context = contextvars.copy_context()
        self.context.run(structlog.contextvars.bind_contextvars, call_id=self.call_id, transport=self.transport)
        loop = asyncio.get_running_loop()
        self.recorder: StereoRecorder | None = None  # made once media flows (on_confirmed)
        self.events = CallEvents(self.call_id)
        agent.metrics.watch(self.events, self.transport)
        library = library or agent.flows  # the inbound flow, or the outbound flow a dial named
        flow = library.current  # this call keeps this version even if the file changes meanwhile
        ambience = Ambience(flow.ambience, seed=zlib.crc32(self.call_id.encode()))
        self.bridge = MediaBridge(loop, None, ambience)
        self.session = CallSession(self.call_id, flow, self.bridge, self, self.events, agent.stt,
                                   agent.tts, services=agent.services_for(flow),
                                   variables=variables, flow_digest=library.digest,
                                   worker=f"{agent.config.listen.host}:{agent.config.listen.port}",
                                   transport=self.transport, transport_id=transport_id)
        self.consult: ConsultLeg | None = None
        self.supervisor: SupervisorLeg | None = None  # a supervisor's own phone, listening in
        self.bridge.on_privacy(self._privacy)
        self.task: asyncio.Task | None = None
        self.started_wall = time.time()
        self.outcome: str | None = None  # how the call ended, in the store's words, once it has

    @property
    def ended(self) -> bool:
        raise NotImplementedError

    # ---- from the transport (on the loop)
    def on_confirmed(self) -> None:
        """Media flows: the recording and the event log are created now, not for a call that never
        connected (an INVITE never ACKed, a browser offer that never connects)."""
        self.log.info("call_confirmed", remote=self.remote_uri, transport=self.transport)
        wav, jsonl = recording_paths(self.agent.config.recordings, self.call_id)
        try:
            self.recorder = self.bridge.recorder = StereoRecorder(wav)
            self.events.open(jsonl)
        except OSError as exc:  # a full disk or a name already taken: the call goes on, unrecorded
            self.log.error("recording_failed", error=str(exc))
        flow = self.session.flow
        self.row = CallRow(self.agent.calls, self.agent.outbox, self.call_id)
        self.row.started(direction=self.direction, transport=self.transport, caller=self.caller_id.get("caller", ""),
                         caller_number=self.caller_id.get("caller_number", ""), flow=flow.name,
                         flow_version=flow.version, recording=str(wav), events=str(jsonl))
        self.task = asyncio.create_task(self._run(), context=self.context)

    def on_disconnected(self, code: int, reason: str) -> None:
        self.log.info("call_disconnected", code=code, reason=reason)
        self.session.end("caller" if self.session.result.ended_by == "caller" else self.session.result.ended_by)
        if self.task is None:  # cancelled before answer, or never confirmed
            self._finish()

    def on_dtmf(self, digit: str) -> None:
        if self.task is not None:
            self.session.on_dtmf(digit)

    # ---- CallControl for the session
    async def hangup(self) -> None:
        raise NotImplementedError

    async def transfer(self, uri: str) -> bool:
        raise NotImplementedError

    async def _connect_person(self, leg: "ConsultLeg") -> None:
        """Put the caller and the person a warm transfer reached in one conversation."""
        raise NotImplementedError

    async def warm_transfer(self, uri: str, summary: str | None, ring_s: float, speak) -> bool:
        """Call the person, brief them with `speak(bridge, summary)`, then connect the caller to
        them. False (and the person's leg hung up) if they do not answer within ring_s, hang up
        during the summary, or no call slot is free."""
        leg = ConsultLeg(self)
        try:
            await leg.dial(uri)
            await leg.answered(ring_s)
            if summary:
                await speak(leg.bridge, summary)
            if leg.ended.done():
                raise SipError("the person hung up during the summary")
            await self._connect_person(leg)
        except (SipError, asyncio.TimeoutError) as exc:
            self.log.warning("warm_transfer_failed", to=uri, error=str(exc) or f"no answer within {ring_s} s")
            leg.close()
            return False
        self.consult = leg
        self.log.info("warm_transfer_bridged", to=uri, recording=str(leg.recorder.path))
        await self._resupervise()
        return True

    # ---- a supervisor's own phone on the call
    async def supervise(self, mode: str, phone: str | None) -> None:
        """Call the supervisor's phone (once) and join it in `mode` (listen, whisper, barge), or
        switch an existing one's mode. SipError says why not."""
        if mode not in SUPERVISION_MODES:
            raise SipError(f"unknown mode {mode!r}; one of {', '.join(SUPERVISION_MODES)}")
        if self.transport != "sip":
            raise SipError("supervisor audio needs a caller on a SIP line (a browser caller's audio is relayed, "
                           "not mixed; use say and take over)")
        leg = self.supervisor
        if leg is None or leg.ended.done():
            if not phone:
                raise SipError("which phone? give the supervisor's SIP URI (phone)")
            leg = SupervisorLeg(self)
            try:
                await leg.dial(phone)
                await leg.answered(SUPERVISOR_RING_S)
            except (SipError, asyncio.TimeoutError) as exc:
                leg.close()
                raise SipError(f"the supervisor's phone {phone}: {exc or 'no answer'}") from None
            self.supervisor = leg
        leg.mode = mode
        await self._resupervise()
        if mode == "barge" and not self.session.bridged and not self.session.held:
            self.session.take_over()  # the supervisor talks to the caller: the AI agent stops talking
            leg.took_over = True
        elif mode != "barge" and leg.took_over:
            leg.took_over = False
            self.session.release()
        self.events.emit(ev.SUPERVISOR, action=mode, phone=phone or "")
        self.log.info("supervisor_joined", mode=mode)

    async def _resupervise(self) -> None:
        """(Re)connect the supervisor's phone for its mode: after joining, a switch, or a bridge."""
        leg = self.supervisor
        if leg is None or leg.ended.done() or self.ended:
            return
        person = self.consult.call if self.consult is not None else None
        await self.agent.endpoint.run_on_sip(self.call.supervise, leg.call, leg.mode, person, not self.session.bridged,
                                             self.bridge.private)

    def _privacy(self, private: bool) -> None:
        """A card number is being given or read back (or no longer): the console is told, and a
        listening supervisor's phone stops hearing the caller and the agent until it is over."""
        self.events.emit(ev.PRIVACY, private=private)
        if self.supervisor is not None and not self.ended:
            task = asyncio.ensure_future(self._resupervise())
            task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or self.log.error(
                "supervisor_privacy_failed", error=str(t.exception())))

    def leave_supervision(self) -> None:
        leg, self.supervisor = self.supervisor, None
        if leg is not None:
            if leg.took_over:
                self.session.release()
            leg.close()
            self.events.emit(ev.SUPERVISOR, action="leave")

    def queue_wait(self, queue: str, settings, whisper: str, speak) -> QueueWait | None:
        """This caller's wait in a queue of agents (None without a contact center)."""
        store = self.agent.queues
        if store is None:
            return None
        store.define_queue(queue, settings.agents, settings.skills, settings.strategy, settings.service_level_s)

        async def dial(uri: str, name: str) -> "ConsultLeg":
            leg = ConsultLeg(self, f"-agent-{name}")
            try:
                await leg.dial(uri)
            except SipError:
                leg.close()
                raise
            return leg

        async def connect(leg: "ConsultLeg") -> None:
            await self._connect_person(leg)
            self.consult = leg
            self.log.info("queue_bridged", queue=queue, recording=str(leg.recorder.path))
            await self._resupervise()

        return QueueWait(store, self.call_id, queue, settings, whisper, dial, connect, speak, self.events,
                         free_slots=self.agent.free_slots,
                         center=lambda **data: self.agent.center_event("agent_state", **data))

    def on_consult_ended(self, leg: "ConsultLeg") -> None:
        if self.consult is leg:  # the person hung up after the bridge: the call is over
            self.session.end("transfer")
        elif self.supervisor is leg:  # the supervisor hung up: the call goes on
            self.leave_supervision()

    async def _run(self) -> None:
        watchdog = asyncio.create_task(self._watch_media())
        try:
            result = await self.session.run()
            self.log.info("call_ended", ended_by=result.ended_by, turns=self.events.turn)
        except Exception:
            self.log.exception("call_failed")
        finally:
            watchdog.cancel()
            if not self.ended:
                await self.hangup()
            self._finish()

    async def _watch_media(self) -> None:
        """A call whose transport has stopped asking for frames is dead air that holds a call slot
        for ever (seen in the soak: pjmedia stopped serving five calls' ports and their BYEs never
        came). After MEDIA_STALL_S without a tick the agent hangs up and frees the slot."""
        last, still = -1, 0.0
        while True:
            await asyncio.sleep(1.0)
            if self.bridge.frames_out != last or self.session.bridged:
                last, still = self.bridge.frames_out, 0.0
                continue
            still += 1.0
            if still >= MEDIA_STALL_S:
                self.log.error("media_stalled", seconds=still, frames_out=last)
                self.events.emit(ev.ERROR, stage="transport", error=f"no media for {still:.0f} s")
                self.session.end("error")
                return

    def _finish(self) -> None:
        if self.consult is not None:
            self.consult.close()
        if self.supervisor is not None:
            self.supervisor.close()
        self.bridge.close()
        self.events.close()
        if self.row is not None:
            result, dialog = self.session.result, self.session.dialog
            slots = dialog.redactor.scrub({k: v for k, v in result.variables.items() if k in self.session.slot_names})
            slots.update({k: str(v) for k, v in dialog.masked.items() if k in slots})
            history = [e.as_dict() for e in self.events.history]
            end = call_end(history, result.ended_by, result.path, slots, result.transferred_to)
            self.row.ended(end)
            self.outcome = end.outcome
            self.row = None
            flow = self.session.flow
            hidden = sensitive_variables(flow) | set(flow.env)  # card numbers and secrets stay in the call
            variables = dialog.redactor.scrub({k: v for k, v in result.variables.items() if k not in hidden})
            self.agent.post_call.call_ended(self.call_id, history, flow.after_call, variables)
        self.agent.live.pop(self.call_id, None)
        self.agent.memory.call_ended()


class ConsultLeg:
    """The agent's own call to a person during a warm transfer, or to a human agent of a queue.
    Recorded beside the caller's recording as `<call>-transfer.wav` or `<call>-agent-<name>.wav`
    (left: the person, right: the summary they heard, then the caller)."""

    def __init__(self, live: LiveCall, suffix: str = "-transfer"):
        loop = asyncio.get_running_loop()
        self.live = live
        base = live.recorder.path if live.recorder is not None else recording_paths(
            live.agent.config.recordings, live.call_id)[0]
        self.recorder = StereoRecorder(unique_path(base.with_name(base.stem + suffix + ".wav")))
        self.bridge = MediaBridge(loop, self.recorder)
        self.confirmed: asyncio.Future = loop.create_future()
        self.media: asyncio.Future = loop.create_future()  # the person's audio is connected
        self.ended: asyncio.Future = loop.create_future()
        self.call: SipCall | None = None
        self._drain = asyncio.create_task(self._discard_frames())

    async def dial(self, uri: str) -> None:
        """Place this leg's call (SipError: no call slot, a bad URI)."""
        endpoint = self.live.agent.endpoint
        self.call = await endpoint.run_on_sip(endpoint.make_call, uri, self, self.bridge)

    async def answered(self, ring_s: float) -> None:
        """Wait until the person answers (within ring_s) and their audio is connected (within
        MEDIA_UP_S after); TimeoutError or SipError (their phone's refusal) otherwise."""
        async with asyncio.timeout(ring_s):
            await asyncio.shield(self.confirmed)
        await self.media_up()

    async def media_up(self) -> None:
        async with asyncio.timeout(MEDIA_UP_S):  # media comes up just after the 200 OK
            await asyncio.shield(self.media)

    async def _discard_frames(self) -> None:
        while True:  # the person's audio is recorded (and relayed) by the bridge; nothing listens here
            await self.bridge.caller_frames.get()

    def relay_with(self, caller: MediaBridge) -> None:
        """Connect the person and the caller through the agent: each side's frames are played to
        the other (a caller leg that pjmedia's conference bridge cannot reach, such as WebRTC)."""
        self.bridge.relay_to(caller)
        caller.relay_to(self.bridge)

    # ---- from the SIP thread
    def on_confirmed(self) -> None:
        if not self.confirmed.done():
            self.confirmed.set_result(True)

    def on_media(self) -> None:
        if not self.media.done():
            self.media.set_result(True)

    def on_disconnected(self, code: int, reason: str) -> None:
        if not self.confirmed.done():
            self.confirmed.set_exception(SipError(f"{code} {reason}"))
            self.confirmed.exception()  # retrieved: no "never retrieved" warning if nobody waits
        if not self.ended.done():
            self.ended.set_result((code, reason))
        self.live.on_consult_ended(self)

    def close(self) -> None:
        if self.call is not None and not self.call.disconnected:
            self.live.agent.endpoint.call_soon(self.call.hangup_now)
        self._drain.cancel()
        self.bridge.close()


class SupervisorLeg(ConsultLeg):
    """A supervisor's own phone joined to a call (`LiveCall.supervise`). Recorded as
    `<call>-supervisor.wav` (left: the supervisor). On a call with the AI agent alone, what the
    supervisor says in whisper mode is recognised and the agent says it to the caller, as a typed
    `say` would: the supervisor steers the AI without the caller hearing the supervisor's voice."""

    def __init__(self, live: LiveCall):
        self.mode = "listen"
        self.took_over = False
        super().__init__(live, "-supervisor")

    async def _discard_frames(self) -> None:
        voiced: list[bytes] = []
        quiet = 0
        while True:
            line = await self.bridge.caller_frames.get()
            whispering_to_ai = self.mode == "whisper" and not self.live.session.bridged
            if not whispering_to_ai:
                voiced, quiet = [], 0
                continue
            loud = line.caller.rms_dbfs() > SUPERVISOR_SPEECH_DBFS
            if loud or voiced:
                voiced.append(line.caller.pcm)
                quiet = 0 if loud else quiet + 1
            if voiced and quiet >= SUPERVISOR_END_FRAMES:
                pcm, voiced, quiet = b"".join(voiced), [], 0
                if len(pcm) >= SUPERVISOR_MIN_BYTES:
                    asyncio.create_task(self._steer(pcm))

    async def _steer(self, pcm: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            text = (await loop.run_in_executor(None, self.live.agent.stt.transcribe_pcm, pcm)).text.strip()
        except Exception as exc:
            self.live.log.error("supervisor_whisper_failed", error=str(exc))
            return
        if text and not self.live.ended:
            self.live.session.supervisor_say(text)


SUPERVISOR_SPEECH_DBFS = -40.0  # the supervisor's own phone: a frame above this is speech
SUPERVISOR_END_FRAMES = 35  # 0.7 s of quiet ends a whispered instruction
SUPERVISOR_MIN_BYTES = 2 * 8000 * 3 // 10  # shorter than 0.3 s: a click, not words
