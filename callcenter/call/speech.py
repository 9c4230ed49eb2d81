"""One thing the agent says, as a handle: its id (the media bridge's utterance number), its
synthesis, whether it was interrupted, and a future that resolves once its last frame has left (or
it was cut off). LiveKit Agents' `SpeechHandle` is the model."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from typing import AsyncIterator

from callcenter.audio.frames import FRAME_MS, AudioFrame

SILENT_DBFS = -60.0  # a frame this quiet is part of the silence a voice opens a sentence with
MIN_LEAD_MS = 40  # of that silence, always kept: a phone's jitter buffer does not clip the first sound


class Speech:
    def __init__(self, speech_id: int, text: str = "", voice=None, private: bool = False):
        self.id = speech_id
        self.text = text
        self.voice = voice
        self.private = private  # says a sensitive value in full: never cached, recorded as silence
        self.audio: str | None = None  # a recorded prompt played instead of the voice (dialog.flow.RECORDED)
        self.synthesis: asyncio.Task | None = None
        self.interrupted = False
        self.played: asyncio.Future = asyncio.get_running_loop().create_future()

    def interrupt(self) -> None:
        """Stop making audio for it; the caller hears no more of it (the bridge drops what is queued)."""
        self.interrupted = True
        if self.synthesis is not None and not self.synthesis.done():
            self.synthesis.cancel()

    def finish(self) -> bool:
        """Its playout is over (played out, or interrupted). True the first time only."""
        if self.played.done():
            return False
        self.played.set_result(None)
        return True

    def __repr__(self) -> str:
        return f"Speech({self.id}, {self.text[:40]!r}{', interrupted' if self.interrupted else ''})"


async def shorten_lead_in(frames: AsyncIterator[AudioFrame], quiet_s: float) -> AsyncIterator[AudioFrame]:
    """A Speech's frames with the silence it opens with shortened by the silence already on the
    line (`quiet_s`: since the agent's last words; `math.inf` before its first).

    The voices open every sentence with about 0.3 s of silence (`ssm:heart` learnt it from its
    teacher: the pause between two sentences). Between sentences said back to back (`quiet_s` near
    0) it is kept whole; after the caller's turn, a wait or a flow's pause it would only be dead
    air before the reply, so the line's silence counts towards it and at most `MIN_LEAD_MS` of it
    is left. A Speech that is silence throughout is passed on whole. `frames` is closed however this
    ends (a barge-in stops the synthesis behind it)."""
    droppable = math.inf if math.isinf(quiet_s) else int(quiet_s * 1000 // FRAME_MS)
    held: deque[AudioFrame] = deque()
    opening = True
    async with contextlib.aclosing(frames) as source:
        async for frame in source:
            if opening and frame.rms_dbfs() < SILENT_DBFS:
                held.append(frame)
                continue
            if opening:
                opening = False
                keep = max(len(held) - droppable, min(len(held), MIN_LEAD_MS // FRAME_MS))
                for quiet in list(held)[len(held) - keep:]:
                    yield quiet
                held.clear()
            yield frame
    for quiet in held:
        yield quiet
