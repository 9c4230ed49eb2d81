"""`callcenter serve`: answer SIP calls and run each through a CallSession."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import signal
import socket
import time
import uuid
import zlib

import structlog

from callcenter.call import events as ev
from callcenter.call.attendant import QueueWait
from callcenter.call.bridge import MediaBridge
from callcenter.call.call_metrics import CallMetrics
from callcenter.call.call_row import CallRow, Outbox
from callcenter.call.events import CallEvents
from callcenter.call.outcome import call_end
from callcenter.call.recording import StereoRecorder, make_private, repair_recordings, unique_path
from callcenter.call.retention import DAY_S, purge_recordings
from callcenter.call.session import HOLD_ON_TEXT, CallSession, recording_paths
from callcenter.dialog.flow import spoken_prompts
from callcenter.dialog.library import FlowLibrary
from callcenter.dialog.services import FlowServices
from callcenter.errors import CallcenterError
from callcenter.hearing.decoding import default_threads
from callcenter.hearing.stt import WhisperStt
from callcenter.hearing.vad import SileroVad
from callcenter.memory import MemoryKeeper, freeze_startup_objects, limit_arenas
from callcenter.store.adopt import adopt_legacy_store
from callcenter.store.calls import CallRecords
from callcenter.store.db import open_database
from callcenter.store.queues import HEARTBEAT_S, QueueStore
from callcenter.store.schema import migrate
from callcenter.store.workers import WorkerRegistry
from callcenter.telephony.config import ServerConfig, load_server_config
from callcenter.telephony.sip import (
    SIP_OK,
    SUPERVISION_MODES,
    TRANSFER_WAIT_S,
    CallInfo,
    SipCall,
    SipEndpoint,
    SipError,
)
from callcenter.voice.ambience import Ambience
from callcenter.voice.speaker import make_tts

log = structlog.get_logger()

MEDIA_STALL_S = 5.0  # a live call whose transport asked for no frame this long is hung up
ANSWER_TIMEOUT_S = 5.0  # a SIP caller who has not ACKed our 200 OK by then is hung up: the slot is freed
MEDIA_UP_S = 2.0  # a person's leg (warm transfer, queue agent, supervisor) whose audio is not up this long after answering fails
SUPERVISOR_RING_S = 30.0  # the supervisor's own phone rings this long before joining is given up


def new_call_id(transport: str) -> str:
    """The server's own name for a call: unique, and safe as a file name whatever the caller sent
    (the SIP Call-ID is kept in `call_start` as `sip_call_id`)."""
    return f"{transport}-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:12]}"


class LiveCall:
    """One caller's call, whatever carries it: the CallSession with its recording, events and media
    bridge, and the CallControl the session uses. `SipLiveCall` and `WebRtcLiveCall` say how to
    hang up, transfer and connect a person's leg on their transport."""

    transport = "sip"
    transfer_bridges = False  # True: a transfer keeps the agent in the media path (no REFER possible)

    def __init__(self, agent: "CallServer", call_id: str, remote_uri: str, variables: dict[str, str],
                 transport_id: dict[str, str] | None = None):
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
        flow = agent.flows.current  # this call keeps this version even if the file changes meanwhile
        ambience = Ambience(flow.ambience, seed=zlib.crc32(self.call_id.encode()))
        self.bridge = MediaBridge(loop, None, ambience)
        self.session = CallSession(self.call_id, flow, self.bridge, self, self.events, agent.stt,
                                   agent.tts, services=agent.services_for(flow),
                                   variables=variables, flow_digest=agent.flows.digest,
                                   worker=f"{agent.config.listen.host}:{agent.config.listen.port}",
                                   transport=self.transport, transport_id=transport_id)
        self.consult: ConsultLeg | None = None
        self.supervisor: SupervisorLeg | None = None  # a supervisor's own phone, listening in
        self.bridge.on_privacy(self._privacy)
        self.task: asyncio.Task | None = None
        self.started_wall = time.time()

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
        self.row.started(transport=self.transport, caller=self.caller_id.get("caller", ""),
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
            self.row.ended(call_end(history, result.ended_by, result.path, slots, result.transferred_to))
            self.row = None
        self.agent.live.pop(self.call_id, None)
        self.agent.memory.call_ended()


class SipLiveCall(LiveCall):
    """A call on a SIP line: one pjsua2 dialog (on the SIP thread) and its session (on the loop)."""

    def __init__(self, agent: "CallServer", call: SipCall, info: CallInfo):
        super().__init__(agent, new_call_id("sip"), info.remote_uri, caller_variables(info.remote_uri),
                         {"sip_call_id": info.call_id})
        self.call = call
        self.info = info
        self._transfer: asyncio.Future | None = None
        call.bridge = self.bridge
        call.listener = self

    @property
    def ended(self) -> bool:
        return self.call.disconnected

    def on_transfer_status(self, code: int, reason: str, final: bool) -> None:
        self.log.info("transfer_status", code=code, reason=reason, final=final)
        # provisional NOTIFYs (100 Trying) say nothing yet; the final one says whether the phone
        # reached the destination
        if self._transfer and not self._transfer.done() and (final or code >= 200):
            self._transfer.set_result(200 <= code < 300)

    async def hangup(self) -> None:
        with contextlib.suppress(SipError):
            await self.agent.endpoint.run_on_sip(self.call.hangup_now)

    async def transfer(self, uri: str) -> bool:
        self._transfer = asyncio.get_running_loop().create_future()
        try:
            await self.agent.endpoint.run_on_sip(self.call.refer, uri)
            async with asyncio.timeout(TRANSFER_WAIT_S):
                return await self._transfer
        except (SipError, asyncio.TimeoutError) as exc:
            self.log.warning("transfer_failed", to=uri, error=str(exc) or "no answer to REFER")
            return False
        finally:
            self._transfer = None

    async def _connect_person(self, leg: "ConsultLeg") -> None:
        await self.agent.endpoint.run_on_sip(self.call.bridge_to, leg.call)


class WebRtcLiveCall(LiveCall):
    """A call from a browser (the /call page): one aiortc peer connection. A browser cannot be
    REFERred, so a transfer of either kind calls the person over SIP and relays the audio between
    the two legs; the agent stays in the media path, as for a warm transfer on a phone line."""

    transport = "webrtc"
    transfer_bridges = True

    def __init__(self, agent: "CallServer", peer, remote_address: str):
        remote = f"webrtc:{remote_address}"
        super().__init__(agent, peer.call_id, remote, {"caller": remote, "caller_number": ""})
        self.peer = peer
        self._closed = False
        peer.attach(self.bridge.caller_frame, self.bridge.agent_frame, self, asyncio.get_running_loop())

    @property
    def ended(self) -> bool:
        return self._closed

    def on_disconnected(self, code: int, reason: str) -> None:
        self._closed = True
        super().on_disconnected(code, reason)

    def on_confirmed(self) -> None:
        """Connected: now the call takes a slot, if one is still free (offers that never connect
        hold none, so a slot can have gone to a phone call meanwhile)."""
        if self.agent.full(exclude=self):
            self.log.warning("webrtc_busy_at_connect", max_calls=self.agent.config.max_calls)
            asyncio.create_task(self.hangup())
            return
        super().on_confirmed()

    def on_dtmf(self, digit: str) -> None:
        if self.task is not None:
            self.session.on_dtmf(digit, source="datachannel")

    async def hangup(self) -> None:
        self._closed = True
        await self.agent.webrtc.hang_up(self.peer, "agent")

    async def transfer(self, uri: str) -> bool:
        return await self.warm_transfer(uri, None, TRANSFER_WAIT_S, None)

    async def _connect_person(self, leg: "ConsultLeg") -> None:
        leg.relay_with(self.bridge)

    def _finish(self) -> None:
        super()._finish()
        if self.agent.webrtc is not None:
            self.agent.webrtc.ended(self.call_id)


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


AGENT_CODES = {"*41": "login", "*42": "logout", "*45": "pause", "*46": "resume"}
AGENT_CODE_SAID = {"login": "you are signed in and taking calls", "logout": "you are signed out",
                   "pause": "you are paused", "resume": "you are available again"}


class AgentCodeCall:
    """A human agent dialled a keypad code from their phone (`*41` log in, `*42` log out, `*45`
    pause, `*46` resume), as in Asterisk's agent logins: the project's Kamailio authenticated them
    and named them in X-Callcenter-Agent. The worker changes their state, says so, and hangs up."""

    def __init__(self, agent: "CallServer", call: SipCall, info: CallInfo):
        from callcenter.store.queues import QueueStoreError

        self.agent, self.call = agent, call
        self.log = log.bind(agent=info.agent, code=info.dialled)
        self.bridge = MediaBridge(asyncio.get_running_loop(), None)
        call.bridge, call.listener = self.bridge, self
        action = AGENT_CODES.get(info.dialled)
        if action is None:
            self.text = ("Sorry, that code is not known. Star four one logs you in, star four two logs you out, "
                         "star four five pauses you, and star four six makes you available again.")
        else:
            try:
                agent.queues.set_agent_state(info.agent, action, "keypad" if action == "pause" else "")
                self.text = f"{info.agent}, {AGENT_CODE_SAID[action]}."
                self.log.info("agent_state", action=action, by="keypad")
                if agent.control is not None:
                    agent.control.agent_changed(info.agent, action, "keypad")
                else:
                    agent.center_event("agent_state", agent=info.agent, action=action, by="keypad",
                                       state=agent.queues.agent(info.agent).state.value)
            except QueueStoreError as exc:
                self.text = f"Sorry, {exc}."
                self.log.warning("agent_code_refused", error=str(exc))
        self._drain = asyncio.create_task(self._discard())
        agent.endpoint.call_soon(call.answer_with, SIP_OK)

    async def _discard(self) -> None:
        while True:
            await self.bridge.caller_frames.get()

    def on_confirmed(self) -> None:
        asyncio.create_task(self._say_and_hang_up())

    async def _say_and_hang_up(self) -> None:
        played = asyncio.get_running_loop().create_future()
        self.bridge.on_playout(lambda utt, at: None, lambda utt, at: played.done() or played.set_result(at))
        try:
            first = True
            async for frame in self.agent.tts.stream(self.text, self.agent.flows.current.voice):
                self.bridge.play(frame, 1, first=first)
                first = False
            self.bridge.end_utterance(1)
            async with asyncio.timeout(30):
                await played
        except Exception as exc:
            self.log.error("agent_code_reply_failed", error=str(exc))
        await asyncio.sleep(0.3)
        self.agent.endpoint.call_soon(self.call.hangup_now)

    def on_disconnected(self, code: int, reason: str) -> None:
        self._drain.cancel()
        self.bridge.close()


def caller_variables(remote: str) -> dict[str, str]:
    """`"Dana" <sip:4155550100@pbx.example>;tag=x` → caller sip:4155550100@pbx.example,
    caller_number 4155550100."""
    import re

    m = re.search(r"(sips?:[^>;\s]+)", remote)
    uri = m.group(1) if m else remote.strip()
    user = uri.split(":", 1)[-1].split("@", 1)[0] if "@" in uri else ""
    return {"caller": uri, "caller_number": user}


class CallServer:
    """One process's call server: SIP endpoint, WebRTC gateway, control API, and the live calls."""

    def __init__(self, config: ServerConfig, flows: FlowLibrary, stt: WhisperStt, tts):
        self.config = config
        self.flows = flows
        self.stt = stt
        self.tts = tts
        self.live: dict[str, LiveCall] = {}
        self.endpoint: SipEndpoint | None = None
        self.control = None  # the supervisor API, when configured
        self.webrtc = None  # the browser callers' gateway, when configured
        self._services: FlowServices | None = None
        self.queues: QueueStore | None = None  # the contact center's shared queues and agents
        worker = f"{config.listen.host}:{config.listen.port}"
        # the system of record: one row per call, and the contact center's queues and agents
        self.store = open_database(config.store_url())
        migrate(self.store)
        if config.store is None and (config.contact_center is None or config.contact_center.store is None):
            adopt_legacy_store(self.store, config.recordings)
        self.calls = CallRecords(self.store, worker, socket.gethostname())
        self.outbox = Outbox()
        self.registry = WorkerRegistry(self.store, worker, socket.gethostname(), _version())
        cc = config.contact_center
        check_queues(self.flows.current, config)
        if cc is None:
            with self.store.transaction():
                self.calls.lost([worker])  # calls an earlier process on this address never finished
        else:  # the queue store's take-over ends those calls too, with its callers and agent legs
            self.queues = QueueStore(self.store, worker, host=socket.gethostname(), registry=self.registry)
            lost = self.queues.take_over()
            if lost:
                log.warning("queue_callers_lost", calls=lost, reason="left by an earlier process on this address")
            removed = self.queues.define_agents([(a.name, cc.uri_of(a), tuple(a.skills), a.logged_in)
                                                 for a in cc.agents])
            if removed:
                log.warning("agents_removed", agents=removed, reason="no longer in the server config")
            for flow_queue, q in self.flows.current.queues.items():
                if not isinstance(q, str):
                    self.queues.define_queue(flow_queue, q.agents, q.skills, q.strategy, q.service_level_s)
        self.memory = MemoryKeeper(config.memory_trim_s)
        self.metrics = CallMetrics(self._active_calls, self._rejected_calls)
        if self.queues is not None:
            self.metrics.watch_queues(self.queues)

    def _active_calls(self) -> dict[tuple[str, ...], float]:
        out = {("sip",): 0, ("webrtc",): 0}
        for live in list(self.live.values()):
            if not live.ended:
                out[(live.transport,)] = out.get((live.transport,), 0) + 1
        return out

    def _rejected_calls(self) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = {}
        for transport, source in (("sip", self.endpoint), ("webrtc", self.webrtc)):
            for reason, n in dict(getattr(source, "rejected", {}) or {}).items():
                out[(transport, reason)] = n
        return out

    def services_for(self, flow) -> FlowServices:
        """One set of webhook/model services per flow version, shared by its calls: the offline
        model's embeddings of choices and knowledge are computed once, not on every call's first turn."""
        if self._services is None or self._services.flow is not flow:
            self._services = FlowServices(flow)
        return self._services

    def _on_incoming(self, call: SipCall, info: CallInfo) -> None:
        if info.agent and self.queues is not None and info.dialled.startswith("*"):
            AgentCodeCall(self, call, info)
            return
        live = SipLiveCall(self, call, info)
        self.live[live.call_id] = live
        if self.control is not None:
            self.control.attach(live)
        live.log.info("call_incoming", remote=info.remote_uri, sip_call_id=info.call_id)
        fut = self.endpoint.call_soon(call.answer_with, SIP_OK)
        fut.add_done_callback(lambda f: f.exception() and live.log.error("answer_failed", error=str(f.exception())))
        asyncio.get_running_loop().call_later(ANSWER_TIMEOUT_S, self._unanswered, live)

    def _unanswered(self, live: "SipLiveCall") -> None:
        """Our 200 OK has had no ACK for ANSWER_TIMEOUT_S: a caller gone, or one holding call slots
        on purpose. Hang up so the slot is free for the next caller."""
        if live.task is None and not live.ended:
            live.log.warning("sip_call_not_acked", after_s=ANSWER_TIMEOUT_S, remote=live.remote_uri)
            self.endpoint.call_soon(live.call.terminate_unanswered)

    def other_calls(self, exclude: LiveCall | None = None) -> int:
        """Connected calls that are not on a SIP line (browser callers): they count toward the same
        cap as SIP calls. A browser offer still connecting takes no slot."""
        return sum(1 for live in list(self.live.values())
                   if live.transport != "sip" and live.task is not None and live is not exclude)

    def free_slots(self) -> int:
        """Calls this process could still place or take (an agent's leg needs one)."""
        if self.endpoint is None:  # not listening yet: browser calls only
            return max(0, self.config.max_calls - self.other_calls())
        return self.endpoint.free_slots()

    def full(self, exclude: LiveCall | None = None) -> bool:
        """Has the process all the calls it may take, SIP and browser together? Browser calls count
        once connected (and `exclude` not at all); each kind has its own cap as well."""
        sip = sum(1 for live in list(self.live.values()) if live.transport == "sip")
        browser = self.other_calls(exclude)
        webrtc_cap = self.config.webrtc.max_calls if self.config.webrtc else 0
        return sip + browser >= self.config.max_calls or (exclude is not None and browser >= webrtc_cap)

    def _on_browser_call(self, peer, remote_address: str) -> None:
        live = WebRtcLiveCall(self, peer, remote_address)
        self.live[live.call_id] = live
        if self.control is not None:
            self.control.attach(live)
        live.log.info("call_incoming", remote=live.remote_uri, transport="webrtc", codec=peer.codec[0])

    async def _start_webrtc(self) -> None:
        from callcenter.telephony.webrtc import WebRtcGateway, use_host_candidates

        cfg = self.config.webrtc
        if cfg.candidates:
            use_host_candidates(cfg.candidates)
        self.webrtc = WebRtcGateway(cfg.host, cfg.port, cfg.max_calls, self._on_browser_call, cfg.stun_servers,
                                    process_full=self.full,
                                    peer_networks=cfg.peer_networks, connect_timeout_s=cfg.connect_timeout_s)
        try:
            await self.webrtc.start()
        except OSError as exc:
            self.webrtc = None
            raise SipError(f"cannot listen for browser calls on {cfg.host}:{cfg.port}: {exc}") from None

    async def warm_prompts(self, flow) -> None:
        """Synthesise the flow's fixed sentences into the voice's prompt cache, one after another,
        while the agent already answers (a caller who needs one meanwhile shares its rendering)."""
        prompts = spoken_prompts(flow) + [(HOLD_ON_TEXT, flow.voice)]
        started = time.monotonic()
        for text, voice in prompts:
            try:
                async for _ in self.tts.stream(text, voice):
                    pass
            except Exception as exc:  # a voice that cannot say it now is the call's problem later, not ours
                log.warning("prompt_not_warmed", text=text, error=str(exc))
        log.info("prompts_warmed", flow=flow.name, version=flow.version, prompts=len(prompts),
                 seconds=round(time.monotonic() - started, 1), cached_mb=round(self.tts.cache.bytes / 2**20, 1))

    def center_event(self, kind: str, **data) -> None:
        """A contact-center event that belongs to no call (an agent's state changed): one JSON line
        in `<recordings>/contact-center-<YYYY-MM-DD>.jsonl` (mode 600), the day's record beside the
        calls' own JSONL."""
        line = {"kind": kind, "wall": round(time.time(), 3),
                "worker": f"{self.config.listen.host}:{self.config.listen.port}", **data}
        path = self.config.recordings / f"contact-center-{time.strftime('%Y-%m-%d')}.jsonl"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(json.dumps(line) + "\n")  # one write of one line: workers appending at once never interleave
        except OSError as exc:
            log.error("center_event_not_written", error=str(exc), event=kind)

    async def keep_queues(self) -> None:
        """This worker's heartbeat in the shared queue store; it also clears what dead workers left."""
        loop = asyncio.get_running_loop()
        while True:
            try:  # off the loop: a store across the network must never hold up the calls' media
                lost = await loop.run_in_executor(None, self.queues.heartbeat, self.free_slots())
                if lost:
                    log.warning("queue_callers_lost", calls=lost, reason="their worker stopped beating")
            except Exception as exc:  # a locked or full disk: the calls go on, the console says so in the log
                log.error("queue_heartbeat_failed", error=str(exc))
            await asyncio.sleep(HEARTBEAT_S)

    async def keep_registered(self) -> None:
        """Without a contact center: this worker's row in the store (address, host, version, free
        slots, control API), every HEARTBEAT_S, off the loop, and the end of dead workers' calls."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(None, self.registry.beat, self.free_slots())
                lost = await loop.run_in_executor(None, self.registry.reap_calls, self.calls)
                if lost:
                    log.warning("calls_lost", calls=lost, reason="their worker stopped beating")
            except Exception as exc:  # the store is away: calls go on, the console may miss this worker
                log.warning("worker_heartbeat_failed", error=str(exc))
            await asyncio.sleep(HEARTBEAT_S)

    async def keep_recordings(self, days: float) -> None:
        """Delete recordings older than `days`: now, then once a day (on a thread: a large folder
        must not hold up the calls)."""
        loop = asyncio.get_running_loop()
        while True:
            removed = await loop.run_in_executor(None, purge_recordings, self.config.recordings, days)
            log.info("recordings_purged", files=len(removed), retention_days=days)
            await asyncio.sleep(DAY_S)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self.endpoint = SipEndpoint(self.config, loop, self._on_incoming, self.other_calls)
        self.endpoint.start()
        background: list[asyncio.Task] = [asyncio.create_task(self.flows.watch())]
        if self.config.warm_prompts and self.config.prompt_cache_mb:
            background.append(asyncio.create_task(self.warm_prompts(self.flows.current)))
            # an edited flow's new sentences too, while calls go on
            self.flows.on_reload = lambda flow: background.append(asyncio.create_task(self.warm_prompts(flow)))
        if self.config.memory_trim_s:
            background.append(asyncio.create_task(self.memory.run()))
        background.append(asyncio.create_task(self.outbox.keep_retrying()))
        if self.config.retention_days:
            background.append(asyncio.create_task(self.keep_recordings(self.config.retention_days)))
        if self.config.control is not None:
            from callcenter.supervisor.api import ControlApi, control_token

            control = self.config.control
            self.control = ControlApi(self, control, self.config.recordings,
                                      control_token(control, self.config.recordings))
            try:
                await self.control.start()
            except OSError as exc:
                self.endpoint.stop()
                raise SipError(f"cannot listen for the control API on {control.host}:{control.port}: {exc}") from None
            self.registry.control = self.control.url
        # one heartbeat: the queue store's (it also clears what dead workers left in the queues), else
        # the registry's own
        background.append(asyncio.create_task(self.keep_queues() if self.queues is not None else self.keep_registered()))
        if self.config.webrtc is not None:
            try:
                await self._start_webrtc()
            except SipError:
                self.endpoint.stop()
                raise
        try:
            await stop.wait()
        finally:
            for task in background:
                task.cancel()
            if self.webrtc is not None:
                await self.webrtc.stop()
            if self.control is not None:
                await self.control.stop()
            for live in list(self.live.values()):
                live.session.end("agent")
            tasks = [lc.task for lc in self.live.values() if lc.task]
            if tasks:
                await asyncio.wait(tasks, timeout=3)
            await loop.run_in_executor(None, self.endpoint.stop)
            await loop.run_in_executor(None, self.outbox.retry)  # the ended calls' rows
            if len(self.outbox):
                log.error("store_writes_lost", writes=len(self.outbox), note="the store did not answer before the stop")
            if self.queues is not None:
                self.queues.forget_worker()
            else:
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(None, self.registry.forget)


def check_queues(flow, config: ServerConfig) -> None:
    """A flow's queues against the server's contact center, at start: a queue of human agents
    without a contact center is refused (it would fail only when a caller reached it), and an agent
    a queue names who is not in the config is a warning with the nearest configured name."""
    from callcenter.dialog.flow import did_you_mean

    queues = {name: q for name, q in flow.queues.items() if not isinstance(q, str)}
    if not queues:
        return
    if config.contact_center is None:
        raise CallcenterError(f"flow {flow.name!r} sends callers to the queue(s) {', '.join(sorted(queues))}, but the "
                              "server config has no contact_center: section (its agents); add one, or make the "
                              "queue a SIP URI")
    known = [a.name for a in config.contact_center.agents]
    for qname, q in queues.items():
        for agent in q.agents:
            if agent not in known:
                log.warning("queue_agent_unknown", queue=qname, agent=agent,
                            hint=did_you_mean(agent, known).strip(" ()") or "add them to contact_center.agents")
        if not q.agents and not any(set(q.skills) & set(a.skills) for a in config.contact_center.agents):
            log.warning("queue_without_agents", queue=qname, note="no configured agent takes its calls")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("callcenter")
    except PackageNotFoundError:
        return ""


def serve(config_path: str, flow_path: str, stt_model: str | None = None) -> int:
    config = load_server_config(config_path)
    limit_arenas(config.malloc_arenas)  # before the models' and media threads allocate
    flows = FlowLibrary(flow_path, prepare=lambda new: Ambience(new.ambience))  # a new version's line noise
    flow = flows.current
    make_private(config.recordings)  # 700 folders, 600 files, also for those of older versions
    fixed = repair_recordings(config.recordings)
    if fixed:
        log.warning("recordings_repaired", files=[str(p) for p in fixed])
    stt = WhisperStt(stt_model, workers=config.decode_threads or default_threads())
    tts = make_tts(flow.voice, cache_bytes=config.prompt_cache_mb * 2**20)
    SileroVad()  # load the VAD model now, not while the first caller waits for an answer
    Ambience(flow.ambience)  # and render the line's noise loops
    from callcenter.dialog.embed import shared_encoder

    shared_encoder()  # and the sentence embeddings for intents
    from callcenter.dialog.local_llm import warm_model

    try:
        warm_model(flow)  # and the offline generative model, when the flow's llm nodes will use it
    except Exception as exc:  # a broken model build: the hybrid falls back to the embedding path per turn
        log.error("llm_model_not_loaded", error=str(exc))
    agent = CallServer(config, flows, stt, tts)
    log.info("startup_objects_frozen", objects=freeze_startup_objects())  # out of the collector's way

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)

    try:
        asyncio.run(main())
    except SipError as exc:
        raise SystemExit(f"callcenter: {exc}") from None
    return 0
