"""Offline calls: a scripted caller plays WAV files (and keypad digits) into the same CallSession a
SIP call uses, on a 20 ms clock in real time, with no network. Used by `callcenter simulate`,
by flow tests and by the benchmarks."""

from __future__ import annotations

import asyncio
import uuid
import wave
from dataclasses import dataclass
from pathlib import Path

import structlog

from callcenter.audio.frames import FRAME_BYTES, FRAME_MS, SAMPLE_RATE, float_to_pcm, frames_from_pcm, pcm_to_float
from callcenter.audio.wavfile import read_wav
from callcenter.call.bridge import MediaBridge
from callcenter.call.caller import EchoPath
from callcenter.call.events import CallEvents
from callcenter.call.recording import StereoRecorder
from callcenter.call.session import CallSession, SessionResult
from callcenter.call.simulated_queue import QueueScript, SimulatedQueueWait
from callcenter.dialog.flow import DTMF_DIGITS, Flow
from callcenter.hearing.dtmf import dtmf_tone
from callcenter.voice.ambience import Ambience

log = structlog.get_logger()

TONE_S = 0.12  # how long the scripted caller holds a key down
CALLER_GAP_S = 0.6  # the scripted caller answers this long after the agent falls silent
MAX_CALL_S = 180.0


@dataclass
class CallerStep:
    """One thing the scripted caller does: say a WAV file or press a key, after the agent has
    finished speaking, or (`over_s`) that long after the agent starts its next prompt, over it."""

    wav: Path | None = None
    digit: str | None = None  # an RFC 4733 event
    tone: str | None = None  # an in-band keypad tone in the caller's audio
    over_s: float | None = None
    silence_s: float | None = None  # stay quiet this long (the agent's no-input reprompt comes meanwhile)

    @classmethod
    def parse(cls, spec: str) -> "CallerStep":
        if spec.startswith("dtmf:"):
            digits = spec[5:]
            if len(digits) != 1 or digits not in DTMF_DIGITS:
                raise ValueError(f"{spec!r}: expected dtmf:<one of 0-9 * #>")
            return cls(digit=digits)
        if spec.startswith("tone:"):
            key = spec[5:]
            if len(key) != 1 or key not in DTMF_DIGITS:
                raise ValueError(f"{spec!r}: expected tone:<one of 0-9 * #>")
            return cls(tone=key)
        if spec.startswith("silence:"):
            try:
                return cls(silence_s=float(spec[8:]))
            except ValueError:
                raise ValueError(f"{spec!r}: expected silence:<seconds>") from None
        if spec.startswith("over:"):
            try:
                seconds, wav = spec[5:].split(":", 1)
                return cls(wav=Path(wav), over_s=float(seconds))
            except ValueError:
                raise ValueError(f"{spec!r}: expected over:<seconds>:<file.wav>") from None
        return cls(wav=Path(spec))


class SimulatedLine:
    """The simulator's stand-in for a SIP dialog: it records what the agent asked the line to do.
    Its queues of human agents are simulated (`queue`: an agent answers after a while, nobody
    comes, or the caller asks for a callback)."""

    transfer_bridges = False

    def __init__(self, accept_transfer: bool = True, queue: QueueScript | None = None) -> None:
        self.transferred_to: str | None = None
        self.hung_up = False
        self.accept_transfer = accept_transfer
        self.summary: str | None = None  # what a warm transfer told the person
        self.queue = queue or QueueScript()
        self.events: CallEvents | None = None  # set by simulate_call

    def queue_wait(self, queue: str, settings, whisper: str, speak) -> SimulatedQueueWait:
        return SimulatedQueueWait(queue, settings, self.queue, self.events)

    async def hangup(self) -> None:
        self.hung_up = True

    async def transfer(self, uri: str) -> bool:
        self.transferred_to = uri
        return self.accept_transfer

    async def warm_transfer(self, uri: str, summary: str, ring_s: float, speak) -> bool:
        """The simulated person answers (unless refusing), hears the summary, is bridged."""
        self.transferred_to = uri
        if not self.accept_transfer:
            return False
        person = MediaBridge(asyncio.get_running_loop())
        listening = asyncio.create_task(_play_out(person))
        try:
            await speak(person, summary)
        finally:
            listening.cancel()
        self.summary = summary
        return True


async def simulate_call(flow: Flow, steps: list[CallerStep], out_dir: Path, stt, tts,
                        call_id: str | None = None, echo: EchoPath | None = None,
                        line: SimulatedLine | None = None, **session_args) -> tuple[SessionResult, CallEvents]:
    """`echo`: the agent's voice comes back on the caller's line through this path (a speakerphone,
    a line hybrid)."""
    call_id = call_id or f"sim-{uuid.uuid4().hex[:12]}"
    out_dir.mkdir(parents=True, exist_ok=True)
    audio = {i: read_wav(s.wav) for i, s in enumerate(steps) if s.wav}  # fail before the call starts
    loop = asyncio.get_running_loop()
    for old in (out_dir / f"{call_id}.wav", out_dir / f"{call_id}.jsonl"):
        old.unlink(missing_ok=True)  # a simulation run again writes afresh (live calls never reuse a name)
    recorder = StereoRecorder(out_dir / f"{call_id}.wav")
    # one clock for everything: the loop's (real time, or virtual under `simulate --fast`)
    events = CallEvents(call_id, out_dir / f"{call_id}.jsonl", clock=loop.time)
    bridge = MediaBridge(loop, recorder, Ambience(flow.ambience, seed=0), clock=loop.time)
    line = line or SimulatedLine()
    line.events = events
    session = CallSession(call_id, flow, bridge, line, events, stt, tts, **session_args)
    agent_pcm = bytearray()
    caller_queue: list[bytes] = []

    async def clock() -> None:
        t0 = loop.time()
        tick = 0
        while True:
            sent = bridge.agent_frame()
            agent_pcm.extend(sent)
            heard = caller_queue.pop(0) if caller_queue else bytes(FRAME_BYTES)
            if echo is not None:
                heard = float_to_pcm(pcm_to_float(heard) + echo.frame(pcm_to_float(sent)))
            bridge.caller_frame(heard)
            tick += 1
            await asyncio.sleep(max(0.0, t0 + tick * FRAME_MS / 1000 - loop.time()))

    async def caller() -> None:
        for i, step in enumerate(steps):
            if step.over_s is not None:
                await _wait_agent_talking(session, bridge)
                await asyncio.sleep(step.over_s)
            else:
                await _wait_agent_silent(session, bridge)
            if session.ended.is_set():
                return
            if step.silence_s is not None:
                await asyncio.sleep(step.silence_s)
            elif step.digit:
                session.on_dtmf(step.digit)
            else:
                pcm = float_to_pcm(dtmf_tone(step.tone, TONE_S)) if step.tone else audio[i]
                caller_queue.extend(f.pcm for f in frames_from_pcm(pcm))
                while caller_queue:
                    await asyncio.sleep(FRAME_MS / 1000)
        await _wait_agent_silent(session, bridge, final=True)

    clock_task = asyncio.create_task(clock())
    caller_task = asyncio.create_task(caller())
    run_task = asyncio.create_task(session.run())
    try:
        await asyncio.wait({run_task, caller_task}, timeout=MAX_CALL_S, return_when=asyncio.FIRST_COMPLETED)
        if not run_task.done():
            # the scripted caller has said everything and heard the agent's answer: she hangs up
            session.end("caller")
        result = await run_task
        while bridge.queued_frames:
            await asyncio.sleep(FRAME_MS / 1000)
    finally:
        caller_task.cancel()
        clock_task.cancel()
        bridge.close()
        events.close()
    with wave.open(str(out_dir / f"{call_id}-agent.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(bytes(agent_pcm))
    (out_dir / f"{call_id}.txt").write_text(
        "".join(f"{who}: {text}\n" for who, text in result.transcript), encoding="utf-8"
    )
    return result, events


async def _play_out(bridge: MediaBridge) -> None:
    """A simulated far end: take the agent's frames on the 20 ms clock."""
    while True:
        bridge.agent_frame()
        await asyncio.sleep(FRAME_MS / 1000)


async def _wait_agent_talking(session: CallSession, bridge: MediaBridge) -> None:
    """Wait until the agent's voice is going out (or the call ended)."""
    while not session.ended.is_set() and not (session.agent_speaking and bridge.queued_frames and not bridge.paused):
        await asyncio.sleep(FRAME_MS / 1000)


async def _wait_agent_silent(session: CallSession, bridge: MediaBridge, final: bool = False) -> None:
    """Wait until the agent has spoken and then been quiet for CALLER_GAP_S (or the call ended).
    `final`: before hanging up, also wait for a voicemail being recorded to finish."""
    quiet_since = None
    clock = asyncio.get_running_loop().time
    while not session.ended.is_set():
        if session.busy or session.utterances_spoken == 0 or final and session.recording_voicemail:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = clock()
        elif clock() - quiet_since >= CALLER_GAP_S:
            return
        await asyncio.sleep(FRAME_MS / 1000)
