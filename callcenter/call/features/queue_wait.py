"""A wait in a queue of human agents: hold music a few frames ahead of the line, the caller's place
and expected wait announced, the callback key, and the flow told how the wait ended."""

from __future__ import annotations

import asyncio

from callcenter.audio.frames import frames_from_pcm
from callcenter.call import events as ev
from callcenter.call.attendant import QueueWait
from callcenter.call.state import CallState
from callcenter.dialog.engine import Enqueue
from callcenter.dialog.flow import RECORDED
from callcenter.text.phone import phone_number

HOLD_UTTERANCE = -2  # the utterance number of hold music frames (no playout events)
HOLD_AHEAD_FRAMES = 8  # hold music queued ahead of the line (an announcement cuts in within 160 ms)
FIRST_ANNOUNCEMENT_S = 1.0  # music first, then where the caller is in line


class QueueWaiting:
    def __init__(self, call):
        self.call = call
        self.wait: QueueWait | None = None  # waiting now: hold music, announcements
        self.callback_key: str | None = None
        self.settings = None  # the queue's settings while waiting

    def on_key(self, digit: str) -> None:
        """In a queue only the callback key means anything."""
        if digit == self.callback_key and self.wait is not None:
            call, settings = self.call, self.settings
            variables = call.dialog.variables
            # a number to call back: the caller's number, else the SIP address they called from
            caller = str(variables.get("caller") or "")
            number = phone_number(variables.get("caller_number") or "") or (caller if caller.startswith("sip") else "")
            keep = (number, call.flow.name, settings.callback_attempts, settings.callback_retry_s) if number else None
            self.wait.leave("callback", keep)
            call.events.emit(ev.QUEUE, what="callback", queue=self.wait.queue, number=number or None,
                             dialled=bool(number))

    async def carry_out(self, action: Enqueue) -> bool:
        """Wait until an agent is connected (True: the call goes on, bridged), or the wait ends
        otherwise and the flow decides."""
        call = self.call
        settings = action.settings
        call.ending_by = "transfer"
        wait = call.control.queue_wait(action.queue, settings, action.whisper, call.speaking.brief)
        if wait is None:
            call.log.error("queue_unavailable", queue=action.queue,
                           error="no contact_center in the server config: nobody can answer a queue")
            result = "unavailable"
        else:
            self.wait, self.callback_key, self.settings = wait.start(), settings.callback_key, settings
            call.status.enter(CallState.QUEUED, action.queue)
            music = call.tasks.keep(asyncio.create_task(self._hold_music(), name="hold_music"))
            announcer = call.tasks.keep(asyncio.create_task(self._announce(wait, settings), name="queue_announcer"))
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
                self.wait = self.callback_key = None
            if call.speaking.speech is not None:  # an announcement cut short by the end of the wait
                call.speaking.interrupt(reason="queue", emit=False)
            call.bridge.flush()
        call.dialog.variables["queue_result"] = result
        if result == "answered":
            call.result.transferred_to = f"queue:{action.queue}/{wait.agent.name}"
            call.events.emit(ev.TRANSFER, to=wait.agent.uri, queue=action.queue, agent=wait.agent.name,
                             mode="queue", accepted=True)
            call.status.enter(CallState.BRIDGED, "queue")
            return True
        call.ending_by = None
        call.status.leave(CallState.QUEUED, result)
        if call.features.transfer.by_supervisor:  # the supervisor queued the caller; unanswered, the flow carries on
            call.features.transfer.by_supervisor = False
            return False
        await call.runner.decide(lambda: call.dialog.on_queue_left(result), caller_input=False)
        return False

    async def _hold_music(self) -> None:
        """The music loop, a few frames ahead of the line; quiet while an announcement plays."""
        from callcenter.voice.hold_music import hold_music

        bridge, speaking = self.call.bridge, self.call.speaking
        settings = self.wait.settings
        pcm = RECORDED.get(settings.music) if settings.music != "generated" else None
        frames = list(frames_from_pcm(pcm or hold_music()))
        i = 0
        while True:
            if speaking.speech is None and bridge.queued_frames < HOLD_AHEAD_FRAMES:
                for _ in range(HOLD_AHEAD_FRAMES - bridge.queued_frames):
                    bridge.play(frames[i % len(frames)], HOLD_UTTERANCE)
                    i += 1
            await asyncio.sleep(0.06)

    async def _announce(self, wait: QueueWait, settings) -> None:
        """Position and expected wait: soon after joining, then every announce_every_s."""
        call = self.call
        first = True
        await asyncio.sleep(FIRST_ANNOUNCEMENT_S)
        while settings.announce_every_s or first:
            place, total, wait_s = wait.position()
            if place:
                call.dialog.variables.update(queue_position=place, queue_wait_s=round(wait_s),
                                             queue_wait_minutes=max(1, round(wait_s / 60)))
                call.events.emit(ev.QUEUE, what="position", queue=wait.queue, position=place, waiting=total,
                                 expected_wait_s=round(wait_s))
                text = call.dialog.render(settings.announcement)
                if first and settings.callback_key:
                    text += " " + settings.callback_offer
                call.bridge.flush()  # the music stops for the announcement
                await call.speaking.say(text)
            first = False
            if not settings.announce_every_s:
                return
            await asyncio.sleep(settings.announce_every_s)
