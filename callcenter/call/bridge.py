"""The media bridge between a transport's 20 ms clock and the asyncio side of a call.

The transport (pjsua2's media clock thread, or the simulator's clock) calls `caller_frame()` with
each frame the caller sent and `agent_frame()` each tick for the frame to send. The asyncio side
reads `caller_frames` (each with the agent frame sent in the same tick, the echo canceller's
reference) and queues agent audio with `play()`; `pause()` holds the agent's voice (a possible
barge-in), `resume()` carries on where it stopped, `flush()` drops queued agent audio (a real
one). Each outgoing frame, speech or silence, passes the call's phone-line ambience; each tick is
written to the stereo recording (what the caller heard), time-aligned.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from callcenter.audio.frames import FRAME_BYTES, AudioFrame
from callcenter.audio.stage import Moment
from callcenter.call.recording import StereoRecorder
from callcenter.voice.ambience import Ambience

LEVEL_EVERY_FRAMES = 10

SILENCE_PCM = bytes(FRAME_BYTES)
REFERENCE_BACKLOG = 5  # agent frames kept for pairing when the clock delivers sends and receives unevenly
FRAME_S = 0.02
LATE_S = FRAME_S  # a frame leaving more than one frame time after its tick is late
RESYNC_S = 0.2  # a transport this far behind has stalled: its clock starts afresh
SOUND_DBFS = -45.0  # an agent frame this loud carries the voice (first_sound), not its opening silence
RELAY_MAX_FRAMES = 5  # relayed audio queued beyond this (two clocks drifting apart) drops its oldest frame
RELAYED = -1  # the utterance number of audio relayed from another leg


@dataclass(frozen=True, slots=True)
class LineFrame:
    """One tick of the line as the caller side hears it: their frame and what the agent sent."""

    caller: AudioFrame
    played: AudioFrame  # the agent's frame of the same tick (after ambience): what may echo back


@dataclass
class _Queued:
    pcm: bytes
    utterance: int
    first: bool
    last: bool
    private: bool = False  # says a sensitive value: silence in the recording


class MediaBridge:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        recorder: StereoRecorder | None = None,
        ambience: Ambience | None = None,
        clock=time.monotonic,
    ):
        self._loop = loop
        self.clock = clock  # the call's clock (a simulation on a virtual clock passes its loop's)
        self.recorder = recorder
        self.ambience = ambience if ambience is not None and ambience.enabled else None
        self.caller_frames: asyncio.Queue[LineFrame] = asyncio.Queue()
        self.paused = False
        self._out: deque[_Queued] = deque()
        self._lock = threading.Lock()
        self._pending_agent: bytes | None = None
        self.levels: tuple[float, float] = (-96.0, -96.0)  # (caller, agent) dBFS of a recent frame
        self._level_frames = 0
        self._references: deque[bytes] = deque(maxlen=REFERENCE_BACKLOG)  # sent, not yet paired
        self._on_first_frame: Callable[[int, float], None] | None = None
        self._on_utterance_played: Callable[[int, float], None] | None = None
        self._on_first_sound: Callable[[int, float], None] | None = None
        self._sounded: int | None = None  # the last utterance whose first sound has left
        self.closed = False
        self._relay: MediaBridge | None = None
        # while the caller gives a sensitive value (a card number) their side of the recording is
        # silence: spoken digits and keypad tones never reach the file (PCI DSS); the same moments,
        # and a private read-back, are kept from a listening supervisor (`on_privacy`)
        self._private_caller = False
        self._private_out: set[int] = set()  # private utterances queued or playing
        self._on_privacy: Callable[[bool], None] | None = None
        # how well the transport keeps the 20 ms clock (both SIP and WebRTC ask for one frame a tick)
        self.frames_out = 0
        self.late_frames = 0
        self.worst_late_s = 0.0
        self._clock0: float | None = None

    # ---- asyncio side
    @property
    def private_caller(self) -> bool:
        return self._private_caller

    @private_caller.setter
    def private_caller(self, value: bool) -> None:
        before = self.private
        self._private_caller = bool(value)
        self._privacy_changed(before)

    @property
    def private(self) -> bool:
        """Is a sensitive value being given or read back on this call right now?"""
        return self._private_caller or bool(self._private_out)

    def on_privacy(self, fn: Callable[[bool], None] | None) -> None:
        """Be told (on the loop) when `private` turns on or off."""
        self._on_privacy = fn

    def _privacy_changed(self, before: bool) -> None:
        if self.private != before and self._on_privacy is not None:
            self._on_privacy(self.private)

    def _private_played(self, utterance: int) -> None:
        before = self.private
        self._private_out.discard(utterance)
        self._privacy_changed(before)

    def on_playout(self, first_frame: Callable[[int, float], None],
                   utterance_played: Callable[[int, float], None],
                   first_sound: Callable[[int, float], None] | None = None) -> None:
        """Be told (on the loop, with a monotonic time) when an utterance's first frame leaves, when
        its first frame with sound in it (over SOUND_DBFS) leaves, and when its last has played."""
        self._on_first_frame = first_frame
        self._on_utterance_played = utterance_played
        self._on_first_sound = first_sound

    def play(self, frame: AudioFrame, utterance: int, first: bool = False, last: bool = False,
             private: bool = False) -> None:
        """Queue one agent frame; `private` (a read-back of a sensitive value) is sent to the caller
        but recorded as silence."""
        if private and utterance not in self._private_out:
            before = self.private
            self._private_out.add(utterance)  # before its first frame can leave
            self._privacy_changed(before)
        with self._lock:
            self._out.append(_Queued(frame.pcm, utterance, first, last, private))

    def end_utterance(self, utterance: int) -> None:
        """Mark the end of an utterance whose frames are all queued (also for an empty one)."""
        with self._lock:
            if self._out and self._out[-1].utterance == utterance:
                self._out[-1].last = True
                return
        if utterance in self._private_out:
            self._private_played(utterance)
        if self._on_utterance_played:
            self._on_utterance_played(utterance, self.clock())

    def pause(self) -> None:
        """Hold the agent's voice: silence (and ambience) goes out, queued audio waits."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def flush(self) -> int:
        """Drop all queued agent audio now; returns how many frames were dropped."""
        with self._lock:
            n = len(self._out)
            self._out.clear()
        for utterance in list(self._private_out):
            self._private_played(utterance)
        return n

    def relay_to(self, other: "MediaBridge | None") -> None:
        """Also play every frame this side's caller sends to `other` (None: stop). Two legs relayed
        both ways hear each other through the agent, each on its own clock."""
        self._relay = other

    def _play_relayed(self, pcm: bytes) -> None:
        with self._lock:
            self._out.append(_Queued(pcm, RELAYED, False, False))
            while len(self._out) > RELAY_MAX_FRAMES and self._out[0].utterance == RELAYED:
                self._out.popleft()

    @property
    def queued_frames(self) -> int:
        return len(self._out)

    # ---- transport clock side (any thread)
    def _tick(self) -> None:
        now = self.clock()
        if self._clock0 is None:
            self._clock0 = now
        late = now - (self._clock0 + self.frames_out * FRAME_S)
        if late > LATE_S:
            self.late_frames += 1
            self.worst_late_s = max(self.worst_late_s, late)
            if late > RESYNC_S:
                self._clock0 = now - self.frames_out * FRAME_S
        self.frames_out += 1

    def media_stats(self) -> dict:
        return {"frames_out": self.frames_out, "late_frames": self.late_frames,
                "worst_late_ms": round(self.worst_late_s * 1000, 1)}

    def agent_frame(self) -> bytes:
        if self.closed:
            return SILENCE_PCM
        self._tick()
        with self._lock:
            item = self._out.popleft() if self._out and not self.paused else None
        if self._pending_agent is not None and self.recorder:
            self.recorder.write(SILENCE_PCM, self._pending_agent)  # the caller sent nothing last tick
        pcm = item.pcm if item else SILENCE_PCM
        if self.ambience is not None:
            pcm = self.ambience.process(AudioFrame(pcm), Moment(self.clock())).pcm
        self._pending_agent = SILENCE_PCM if item is not None and item.private else pcm
        self._references.append(pcm)
        if item is not None:
            now = self.clock()
            if item.first and self._on_first_frame:
                self._loop.call_soon_threadsafe(self._on_first_frame, item.utterance, now)
            if self._on_first_sound and item.utterance >= 0 and item.utterance != self._sounded \
                    and AudioFrame(item.pcm).rms_dbfs() > SOUND_DBFS:
                self._sounded = item.utterance
                self._loop.call_soon_threadsafe(self._on_first_sound, item.utterance, now)
            if item.last and self._on_utterance_played:
                self._loop.call_soon_threadsafe(self._on_utterance_played, item.utterance, now + 0.02)
            if item.last and item.private:
                self._loop.call_soon_threadsafe(self._private_played, item.utterance)
        return pcm

    def caller_frame(self, pcm: bytes) -> None:
        if self.closed or len(pcm) != FRAME_BYTES:
            return
        agent = self._pending_agent if self._pending_agent is not None else SILENCE_PCM
        self._pending_agent = None
        if self.recorder:
            self.recorder.write(SILENCE_PCM if self.private_caller else pcm, agent)
        self._level_frames += 1
        if self._level_frames >= LEVEL_EVERY_FRAMES:  # level meters for the supervisor, 5 times a second
            self._level_frames = 0
            self.levels = (round(AudioFrame(pcm).rms_dbfs(), 1), round(AudioFrame(agent).rms_dbfs(), 1))
        reference = self._references.popleft() if self._references else SILENCE_PCM
        relay = self._relay
        if relay is not None and not relay.closed:
            relay._play_relayed(pcm)
        self._loop.call_soon_threadsafe(self.caller_frames.put_nowait, LineFrame(AudioFrame(pcm), AudioFrame(reference)))

    def close(self) -> None:
        self.closed = True
        if self.recorder:
            self.recorder.close()
