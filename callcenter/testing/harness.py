"""`CallHarness`: a `CallSession` with fake hearing and voice, on the loop's clock (the virtual
clock under `run_call`), driven in text."""

from __future__ import annotations

import asyncio
import math
import struct

from callcenter.audio.frames import FRAME_BYTES, FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, AudioFrame
from callcenter.call import events as ev
from callcenter.call.bridge import MediaBridge
from callcenter.call.events import CallEvents
from callcenter.call.session import CallSession, SessionResult
from callcenter.call.simulate import SimulatedLine
from callcenter.call.virtual_clock import run_virtual
from callcenter.dialog.flow import Flow

FRAMES_PER_WORD = 12  # 240 ms a word: about a voice's pace
TONE_HZ = 440.0


def _tone_frame(i: int) -> AudioFrame:
    start = i * FRAME_SAMPLES
    samples = [int(3000 * math.sin(2 * math.pi * TONE_HZ * (start + n) / SAMPLE_RATE)) for n in range(FRAME_SAMPLES)]
    return AudioFrame(struct.pack(f"<{FRAME_SAMPLES}h", *samples))


class FakeVoice:
    """A voice that says every word as FRAMES_PER_WORD frames of a quiet tone, at once."""

    def __init__(self, frames_per_word: int = FRAMES_PER_WORD):
        self.frames_per_word = frames_per_word
        self.said: list[str] = []

    async def stream(self, text: str, voice=None, cache: bool = True):
        self.said.append(text)
        for i in range(max(1, len(text.split())) * self.frames_per_word):
            yield _tone_frame(i)
            if i % 50 == 49:
                await asyncio.sleep(0)


class FakeRecognizer:
    """Never asked: the harness's caller speaks in text. A call that decodes audio anyway fails loudly."""

    def transcribe_pcm(self, *args, **kwargs):
        raise AssertionError("the harness's caller speaks in text; nothing should decode audio")


class CallHarness:
    """One call with fakes around a real `CallSession`: `await start()`, then the caller's text
    (`say`), keys (`key`), the supervisor's hands (`session.supervisor_say`...), and `hang_up()`."""

    def __init__(self, flow: Flow, line: SimulatedLine | None = None, variables: dict | None = None,
                 far_end: bytes | None = None, stt=None):
        """`far_end`: what the other side sends from the answer on (8 kHz 16-bit PCM; silence after),
        as a dialled call's greeting; `stt` then the recognizer that hears it."""
        self.flow = flow
        self.far_end = far_end
        self.stt = stt or FakeRecognizer()
        self.heard = bytearray()  # what the far end heard, from the answer on (8 kHz 16-bit PCM)
        self.line = line or SimulatedLine()
        self.voice = FakeVoice()
        self.variables = variables
        self.session: CallSession | None = None
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> "CallHarness":
        loop = asyncio.get_running_loop()
        events = CallEvents("harness", None, clock=loop.time)
        self.line.events = events
        bridge = MediaBridge(loop, None, None, clock=loop.time)
        self.session = CallSession("harness", self.flow, bridge, self.line, events, self.stt, self.voice,
                                   variables=self.variables, backup_tts=self.voice)
        self._tasks = [asyncio.create_task(self._far_end(bridge)), asyncio.create_task(self.session.run())]
        await self.settle()
        return self

    async def _far_end(self, bridge: MediaBridge) -> None:
        """The caller's phone: takes the agent's frames on the 20 ms clock (and sends `far_end`)."""
        sent = 0
        while True:
            self.heard += bridge.agent_frame()
            if self.far_end is not None:
                chunk = self.far_end[sent:sent + FRAME_BYTES]
                bridge.caller_frame(chunk + bytes(FRAME_BYTES - len(chunk)))
                sent += FRAME_BYTES
            await asyncio.sleep(FRAME_MS / 1000)

    @property
    def events(self) -> CallEvents:
        return self.session.events

    async def settle(self, quiet_s: float = 0.3, limit_s: float = 120.0) -> None:
        """Wait until the agent has nothing more to say or do for `quiet_s` (or the call ended)."""
        loop = asyncio.get_running_loop()
        deadline, quiet_since = loop.time() + limit_s, None
        while not self.session.ended.is_set() and loop.time() < deadline:
            if self.session.busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = loop.time()
            elif loop.time() - quiet_since >= quiet_s:
                return
            await asyncio.sleep(FRAME_MS / 1000)

    async def say(self, text: str) -> None:
        """The caller says `text` (as the recognizer would have heard it), then the agent answers."""
        s = self.session
        s.events.next_turn()
        s.events.emit(ev.SPEECH_START, over_agent=s.speaking.speaking, floor_db=-60.0)
        s.events.emit(ev.STT_FINAL, text=s.features.privacy.shown(text), confidence=0.9, stt_s=0.0, via="text")
        s.runner.in_flight += 1
        s.tasks.keep(asyncio.create_task(s.hearing.answer(text, 0.9)))
        await self.settle()

    async def key(self, digits: str) -> None:
        for d in digits:
            self.session.on_dtmf(d)
            await asyncio.sleep(0.2)
        await self.settle()

    async def hang_up(self) -> SessionResult:
        if not self.session.ended.is_set():
            self.session.end("caller")
        result = await self._tasks[1]
        self._tasks[0].cancel()
        return result

    def said(self) -> list[str]:
        """What the agent said, in order."""
        return [e.data["text"] for e in self.events.history if e.kind == ev.AGENT_SAY]

    def kinds(self, kind: str) -> list[dict]:
        return [e.as_dict() for e in self.events.history if e.kind == kind]


def run_call(flow: Flow, script, line: SimulatedLine | None = None, variables: dict | None = None,
             far_end: bytes | None = None, stt=None):
    """Run `script(harness)` (an async function) against one call on the virtual clock; returns
    (harness, the call's result)."""
    async def main():
        harness = await CallHarness(flow, line, variables, far_end, stt).start()
        await script(harness)
        return harness, await harness.hang_up()
    return run_virtual(main())
