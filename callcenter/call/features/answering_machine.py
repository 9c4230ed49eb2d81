"""Answering-machine detection on a call the server dialled (`hearing/amd.py` decides; this part
acts on its decisions).

- Until the greeting sounds like a person's (or nobody spoke for a moment), the far end's frames go
  to the detector only, and the flow has not started: then it starts at once, so a person hears its
  first prompt with no dead air while the detector keeps listening.
- The flow's `amd` variable reads `unknown`, then `person` or `machine` as the detector decides.
- On a machine the flow stops (`CallState.ANSWERING_MACHINE`): the agent's voice is cut at once, and
  after the beep (or the end of a greeting that has none) the flow's `voicemail_drop` is said, then
  the call hangs up. A flow without one hangs up on the machine. A beep heard while the message
  has begun restarts it after the beep, so the machine records all of it.
- What the far end says before the decision reaches the flow only once it is decided, and never
  on a machine: a greeting that goes on over the first prompt is no answer to it.
- Every step is an `amd` event: greeted, words, decided, beep, message."""

from __future__ import annotations

import asyncio

from callcenter.audio.frames import SAMPLE_RATE, AudioFrame
from callcenter.audio.stage import Moment
from callcenter.call import events as ev
from callcenter.call.state import CallState
from callcenter.hearing.amd import (
    MACHINE,
    UNKNOWN,
    AnsweringMachineDetector,
    BeepEnded,
    Decided,
    Greeted,
    GreetingOver,
    WantWords,
)
from callcenter.hearing.decoding import PAUSED, Decode

MESSAGE_DONE_POLL_S = 0.05


class AnsweringMachine:
    def __init__(self, call):
        self.call = call
        self.detector: AnsweringMachineDetector | None = None
        self.before_flow = False  # the greeting is being judged: the flow has not started
        self.machine = False  # a machine answered: the flow has stopped
        self.settled = asyncio.Event()  # decided (person, machine or unknown), or nothing to decide
        self.settled.set()
        self._message: asyncio.Task | None = None

    def screen(self) -> bool:
        """On a dialled call whose flow detects machines: hold the flow until the greeting is
        judged (True). Otherwise the flow starts now (False)."""
        call = self.call
        if call.dialog.variables.get("direction") != "outbound" or not call.flow.machine_detection:
            return False
        self.detector = AnsweringMachineDetector()
        call.dialog.variables["amd"] = UNKNOWN
        self.before_flow = True
        self.settled.clear()
        return True

    async def not_a_machine(self) -> bool:
        """May what the far end said go to the flow as an answer? Words heard while the detector
        still decides wait for its decision (a machine's greeting goes on over the first prompt,
        and its words are no answer); False on a machine."""
        if not self.settled.is_set():
            try:
                async with asyncio.timeout(self.detector.s.analysis_s):
                    await self.settled.wait()
            except TimeoutError:
                pass
        return not self.machine

    def hear(self, frame: AudioFrame, at: Moment) -> bool:
        """One 20 ms frame from the far end; True where it is the detector's alone (the flow has
        not started, or a machine answered)."""
        if self.detector is None:
            return False
        if not self.detector.done:
            for event in self.detector.process(frame, at):
                self._on(event)
        return self.before_flow or self.machine

    # ---------------------------------------------------------------- the detector's events
    def _on(self, event) -> None:
        call = self.call
        if isinstance(event, Greeted):
            call.events.emit(ev.AMD, what="greeted", at_s=event.t, speech_s=event.speech_s)
            if self.before_flow and not self.machine:
                self.before_flow = False
                call.runner.act(call.dialog.start())
        elif isinstance(event, WantWords):
            self._words(event)
        elif isinstance(event, Decided):
            call.dialog.variables["amd"] = event.label
            call.events.emit(ev.AMD, what="decided", decision=event.label, at_s=event.t, why=event.why,
                             **({"revised": True} if event.revised else {}))
            call.log.info("amd_decided", decision=event.label, at_s=event.t, why=event.why)
            self.settled.set()
            if event.label == MACHINE:
                self._stop_flow(event.why)
        elif isinstance(event, BeepEnded):
            call.events.emit(ev.AMD, what="beep", at_s=event.end, beep_ms=round((event.end - event.start) * 1000),
                             hz=event.hz)
            self._leave_message(after_beep=True)
        elif isinstance(event, GreetingOver):
            call.events.emit(ev.AMD, what="greeting_over", at_s=event.t)
            self._leave_message(after_beep=False)

    def _words(self, want: WantWords) -> None:
        call = self.call
        loop = asyncio.get_running_loop()
        decode = loop.run_in_executor(call.hearing.decoder, Decode(PAUSED, call.hearing.stt.transcribe_pcm,
                                                                   stream=(call.call_id, "amd")),
                                      want.pcm, SAMPLE_RATE, None, None)

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None or call.ended.is_set() or self.detector.done:
                return
            text = f.result().text
            call.events.emit(ev.AMD, what="words", text=text, at_s=self.detector.t)
            for event in self.detector.heard(text):
                self._on(event)

        decode.add_done_callback(done)

    # ---------------------------------------------------------------- a machine answered
    def _stop_flow(self, why: str) -> None:
        call = self.call
        self.machine, self.before_flow = True, False
        call.status.enter(CallState.ANSWERING_MACHINE, why)
        call.runner.cancel_no_input()
        if call.speaking.speaking:
            call.speaking.interrupt(reason="answering machine")

    def _leave_message(self, after_beep: bool) -> None:
        call = self.call
        if not self.machine or call.ended.is_set():
            return
        if self._message is not None:
            if not after_beep or self._message.done():
                return
            self._message.cancel()  # a late beep: the machine records from now, so start again
            call.speaking.interrupt(reason="beep", emit=False)
        self._message = call.tasks.keep(asyncio.create_task(self._say_message(after_beep)))

    async def _say_message(self, after_beep: bool) -> None:
        call = self.call
        drop = call.flow.voicemail_drop
        if drop is not None:
            text = call.dialog.render(drop.text)
            call.events.emit(ev.AMD, what="message", after="beep" if after_beep else "greeting", text=text)
            await call.speaking.say(text, None, False, drop.audio)
            while call.speaking.speaking and not call.ended.is_set():
                await asyncio.sleep(MESSAGE_DONE_POLL_S)
        else:
            call.events.emit(ev.AMD, what="hangup", reason="the flow has no voicemail_drop")
        if call.ended.is_set():
            return
        call.ending_by = "agent"
        call.events.emit(ev.HANGUP, by="agent")
        await call.control.hangup()
        call.end("agent")
