"""What a call needs from the world, as typed interfaces: a recognizer, a voice, a media line and
the transport's call control. `CallSession` is built from these, so any part can be swapped for a
fake (`callcenter/testing`) or another transport without the call knowing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from callcenter.audio.frames import AudioFrame
from callcenter.call.attendant import QueueWait
from callcenter.hearing.stt import Transcript


class Recognizer(Protocol):
    """Speech to text: one turn's 8 kHz 16-bit PCM at a time (Whisper, or a fake)."""

    def transcribe_pcm(self, pcm: bytes, rate: int = ..., hint: str | None = None,
                       grammar=None) -> Transcript: ...


class Voice(Protocol):
    """Text to speech: an utterance as 20 ms frames, as soon as each is made."""

    def stream(self, text: str, voice=None, cache: bool = True) -> AsyncIterator[AudioFrame]: ...


class MediaLine(Protocol):
    """The call's audio both ways (`call/bridge.py`'s `MediaBridge`): the caller's frames in, the
    agent's utterances out, with playout stamps, hold, flush and privacy."""

    caller_frames: asyncio.Queue
    clock: Callable[[], float]
    paused: bool
    private_caller: bool

    @property
    def queued_frames(self) -> int: ...
    def play(self, frame: AudioFrame, utterance: int, first: bool = False, last: bool = False,
             private: bool = False) -> None: ...
    def end_utterance(self, utterance: int) -> None: ...
    def on_playout(self, first_frame: Callable[[int, float], None], utterance_played: Callable[[int, float], None],
                   first_sound: Callable[[int, float], None] | None = None) -> None: ...
    def flush(self) -> int: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def media_stats(self) -> dict: ...


class CallControl(Protocol):
    """What the transport does for the call: hang up, transfer, and the wait in a queue."""

    # True where a transfer keeps the agent in the media path (a browser caller cannot be REFERred):
    # after a blind transfer the call goes on, bridged, instead of ending
    transfer_bridges: bool

    async def hangup(self) -> None: ...
    async def transfer(self, uri: str) -> bool: ...
    async def warm_transfer(self, uri: str, summary: str, ring_s: float, speak) -> bool: ...
    # a wait in a queue of human agents, or None where no contact center is configured
    def queue_wait(self, queue: str, settings, whisper: str, speak) -> QueueWait | None: ...
