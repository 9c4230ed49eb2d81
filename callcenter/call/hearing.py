"""The caller's side of a call: every 20 ms frame through the listener (line front, turn detector,
keypad tones); pauses decoded while the caller pauses, so the text is often ready when the turn
ends; barge-in over the agent; a recognizer that is slow gets "one moment", one that stalls the
trouble path. What the caller said goes to the flow runner; keys go there too."""

from __future__ import annotations

import asyncio

from callcenter.audio.frames import SAMPLE_RATE
from callcenter.audio.stage import Moment
from callcenter.call import events as ev
from callcenter.call.bridge import LineFrame
from callcenter.dialog.engine import Say
from callcenter.dialog.flow import DTMF_DIGITS
from callcenter.hearing.decoding import ENDED, PARTIAL, PAUSED, Decode, decode_executor
from callcenter.hearing.front import HearingConfig
from callcenter.hearing.listener import Key, Listener, Outcome
from callcenter.hearing.turns import BargeIn, Discarded, Ended, Pause, Resume, Started, Turn

STT_STALL_S = 1.0  # end of turn → transcript: past this the caller hears "one moment"
STT_GIVE_UP_S = 3.0  # past this the recognizer counts as stalled: the trouble path
HOLD_ON_TEXT = "One moment, please."


class Hearing:
    def __init__(self, call, stt, config: HearingConfig | None = None):
        self.call = call
        self.stt = stt
        self.decoder = decode_executor(stt)  # shared by every call on this recognizer: ended turns first
        self.config = config or HearingConfig()
        self.listener = Listener(self.config)
        self.decodes: dict[tuple[int, int], asyncio.Future] = {}  # the listener's Pause requests, running

    async def run(self) -> None:
        call = self.call
        while True:
            line: LineFrame = await call.bridge.caller_frames.get()
            now = call.events.now()
            if call.bridged:  # a person has the caller now: keep recording, stop listening
                continue
            if call.features.machine.hear(line.caller, Moment(now)):  # a dialled call's greeting, or a machine
                continue
            if call.features.queue.wait is not None:  # on hold: only the keypad (tones too) is heard
                for outcome in self.listener.process(line.caller, Moment(now, line.played, agent_talking=True)):
                    if isinstance(outcome, Key):
                        self.on_key(outcome)
                continue
            if call.features.voicemail.recorder is not None:
                call.features.voicemail.recorder.add(line.caller.pcm, agent_talking=call.speaking.speaking)
            talking = call.speaking.speaking and not call.dialog.finished
            for outcome in self.listener.process(line.caller, Moment(now, line.played, agent_talking=talking)):
                self.carry_out(outcome, now)

    def carry_out(self, event: Outcome, now: float) -> None:
        """Do what the listener's outcome asks of the call."""
        call = self.call
        if isinstance(event, Key):
            self.on_key(event)
            return
        if call.features.voicemail.recorder is not None:  # a message being left is recorded, not answered
            call.features.voicemail.recorder.heard(event, now)
            return
        if isinstance(event, Started):
            call.features.privacy.begin_turn()
            call.runner.cancel_no_input()
            call.events.next_turn()  # the turn's partials, final and answer share its number
            call.events.emit(ev.SPEECH_START, over_agent=event.agent_talking, floor_db=round(self.listener.floor_db, 1))
            if event.agent_talking:
                call.bridge.pause()
                call.events.emit(ev.AGENT_PAUSED, reason="caller speech")
        elif isinstance(event, Pause):
            self.start_decode(event)
        elif isinstance(event, BargeIn):
            call.speaking.interrupt(reason=event.reason)
        elif isinstance(event, Resume):
            call.bridge.resume()
            call.events.emit(ev.AGENT_RESUMED, reason=event.reason)
        elif isinstance(event, Discarded):
            call.events.emit(ev.SPEECH_IGNORED, reason=event.reason)
        elif isinstance(event, Ended):
            turn = event.turn
            if call.bridge.paused:  # spoke over the agent and it counted: the agent has been interrupted
                call.bridge.resume()
            call.events.emit(ev.SPEECH_END, audio_s=round(turn.seconds, 3), silence_ms=round(event.silence_ms),
                             last_voice_t=round(now - event.silence_ms / 1000, 4), why=event.why)
            call.runner.in_flight += 1
            call.tasks.keep(asyncio.create_task(self.recognise(turn, call.features.privacy.turn_private)))

    def start_decode(self, pause: Pause) -> None:
        call = self.call
        if (pause.recheck or pause.partial and not pause.over_agent) and self.decoder.busy:
            # a look for the console, or a second look at a pause already decoded: not while other
            # calls' decodes need the recognizer
            self.listener.declined(pause.turn_id, pause.key)
            return
        key = (pause.turn_id, pause.key)
        loop = asyncio.get_running_loop()
        expect = self.listener.expect
        if pause.partial:
            decode = Decode(PARTIAL, self.stt.transcribe_pcm, stream=(call.call_id, pause.turn_id))
        else:  # skipped if the caller has gone on talking by the time the recognizer gets to it
            decode = Decode(PAUSED, self.stt.transcribe_pcm, stream=(call.call_id, pause.turn_id),
                            wanted=lambda: not self.listener.outdated(*key))
        future = loop.run_in_executor(self.decoder, decode, pause.pcm, SAMPLE_RATE, None, expect)
        self.decodes[key] = future
        for old in [k for k in self.decodes if k[0] < pause.turn_id - 1]:
            del self.decodes[old]

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None or call.ended.is_set():
                return
            result = f.result()
            call.events.emit(ev.STT_PARTIAL, text=call.features.privacy.shown(result.text), confidence=round(result.confidence, 3),
                             audio_s=round(result.audio_s, 2), stt_s=round(result.seconds, 3), partial=pause.partial,
                             recheck=pause.recheck)
            now = call.events.now()
            for event in self.listener.decoded(pause.turn_id, pause.key, result.text, result.confidence,
                                               result.guessed):
                self.carry_out(event, now)
            if not pause.partial and expect.finished is not None and result.text.strip() and self.listener.in_speech:
                self._judge(pause, expect.finished, result.text)

        future.add_done_callback(done)

    def _judge(self, pause: Pause, finished, text: str) -> None:
        """Does the pause's text read as a finished sentence? (A language model: on a worker thread.)"""
        call = self.call
        t0 = call.events.now()
        judging = asyncio.get_running_loop().run_in_executor(None, finished, text)

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None or call.ended.is_set():
                return
            now = call.events.now()
            call.events.emit(ev.TURN_JUDGED, finished=f.result(), ms=round((now - t0) * 1000))
            for event in self.listener.judged(pause.turn_id, pause.key, f.result()):
                self.carry_out(event, now)

        judging.add_done_callback(done)

    async def recognise(self, turn: Turn, private: bool = False) -> None:
        call = self.call
        try:
            stream = (call.call_id, turn.turn_id)
            if turn.text is not None:
                text, conf, stt_s, how = turn.text, turn.confidence, 0.0, "early"
                self._cancel_looks(turn.turn_id)
            else:
                covering = self.listener.covering(turn)
                if covering is not None and covering in self.decodes:
                    decode, how = self.decodes[covering], "in flight"
                    self.decoder.hurry(stream)  # the caller waits for it now
                else:
                    expect = self.listener.expect
                    decode = asyncio.get_running_loop().run_in_executor(
                        self.decoder, Decode(ENDED, self.stt.transcribe_pcm, stream=stream),
                        turn.pcm, SAMPLE_RATE, None, expect)
                    how = "after end"
                self._cancel_looks(turn.turn_id, but=decode)
                result = await self._await_transcript(decode)
                text, conf, stt_s = result.text, result.confidence, result.seconds
            call.events.emit(ev.STT_FINAL, text=call.features.privacy.shown(text, private), confidence=round(conf, 3),
                             stt_s=round(stt_s, 3), via=how)
        except Exception as exc:  # a recognizer that raises or stalls: tell the caller, don't go silent
            error = str(exc) or f"no transcript after {STT_GIVE_UP_S} s"
            call.log.error("stt_failed", error=error)
            call.events.emit(ev.ERROR, stage="stt", error=error)
            call.runner.in_flight = max(0, call.runner.in_flight - 1)
            call.trouble("stt")
            return
        await self.answer(text, conf)

    async def answer(self, text: str, conf: float) -> None:
        """What the caller said (counted in the runner's `in_flight`) goes to the flow, or, while a
        supervisor has the call, is heard and logged but not answered."""
        call = self.call
        if not await call.features.machine.not_a_machine():  # a machine's greeting is no answer
            call.runner.in_flight = max(0, call.runner.in_flight - 1)
            return
        if call.features.supervision.held:
            call.runner.in_flight = max(0, call.runner.in_flight - 1)
            call.features.supervision.heard(text)
            return
        await call.runner.decide(lambda: call.dialog.on_utterance(text, conf) if text else call.dialog.on_no_input())

    def _cancel_looks(self, turn_id: int, but: asyncio.Future | None = None) -> None:
        """The turn has its text or the decode that gives it: other looks at it no one needs now."""
        for key, other in list(self.decodes.items()):
            if key[0] == turn_id and other is not but and not other.done():
                other.cancel()

    async def _await_transcript(self, decode: asyncio.Future):
        """The decode's result; "one moment" to the caller if it is slow, TimeoutError if stalled."""
        call = self.call
        try:  # shielded: a timeout gives up waiting, not the decode
            async with asyncio.timeout(STT_STALL_S):
                return await asyncio.shield(decode)
        except TimeoutError:
            if not call.speaking.speaking:
                call.events.emit(ev.STAGE_SLOW, stage="stt", after_s=STT_STALL_S)
                call.runner.act([Say(HOLD_ON_TEXT)])
        async with asyncio.timeout(STT_GIVE_UP_S - STT_STALL_S):
            return await asyncio.shield(decode)

    def on_dtmf(self, digit: str, source: str = "rfc4733") -> None:
        """A keypad digit from signalling (RFC 4733 telephone events, the browser's keypad channel).
        A peer that also sends it as a tone gets one digit (the listener drops the second)."""
        key = self.listener.key(digit, source, self.call.events.now())
        if key is not None:
            self.on_key(key)

    def on_key(self, key: Key) -> None:
        call = self.call
        digit, source = key.digit, key.source
        call.events.next_turn()
        if digit not in DTMF_DIGITS:  # A-D: a tone no telephone keypad sends to us
            call.events.emit(ev.DTMF, digit=digit, source=source, ignored=True)
            return
        if not call.dialog.collecting_sensitive:  # a card number's keys are not logged one by one
            call.events.emit(ev.DTMF, digit=digit, source=source)
        if call.features.voicemail.recorder is not None:
            if digit == "#":
                call.features.voicemail.recorder.finish("pound")
            return
        if call.features.queue.wait is not None:
            call.features.queue.on_key(digit)
            return
        call.runner.cancel_no_input()
        if call.dialog.finished or call.features.supervision.held:
            return
        if call.speaking.speaking:
            call.speaking.interrupt(reason="keypad")
        call.runner.in_flight += 1
        call.tasks.keep(asyncio.create_task(call.runner.decide(lambda: call.dialog.on_dtmf(digit))))
