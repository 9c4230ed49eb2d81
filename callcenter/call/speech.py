"""One thing the agent says, as a handle: its id (the media bridge's utterance number), its
synthesis, whether it was interrupted, and a future that resolves once its last frame has left (or
it was cut off). LiveKit Agents' `SpeechHandle` is the model."""

from __future__ import annotations

import asyncio


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
