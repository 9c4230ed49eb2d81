"""Voicemail: the caller's message after the beep, saved as a mono WAV beside the call's recording.

The message ends when the caller presses #, stops talking for the node's `end_silence_s`, or reaches
`max_s`. The file is written as it is spoken (a hang-up mid-message keeps everything said).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from callcenter.audio.frames import FRAME_MS, SAMPLE_RATE, AudioFrame, float_to_pcm, frames_from_pcm
from callcenter.call.recording import WavWriter
from callcenter.hearing.turns import Ended, Started

BEEP_HZ = 1000.0
BEEP_S = 0.4
BEEP_DBFS = -12.0


def beep_frames() -> list[AudioFrame]:
    t = np.arange(int(BEEP_S * SAMPLE_RATE)) / SAMPLE_RATE
    ramp = np.minimum(1.0, np.minimum(t, BEEP_S - t) / 0.01)
    tone = 10 ** (BEEP_DBFS / 20) * np.sqrt(2) * np.sin(2 * np.pi * BEEP_HZ * t) * ramp
    return list(frames_from_pcm(float_to_pcm(tone)))


def voicemail_path(events_path: Path | None, call_id: str) -> Path | None:
    """`<recording>-voicemail.wav` beside the call's recording (None for a call recorded nowhere)."""
    if events_path is None:
        return None
    stem = events_path.stem
    existing = sorted(events_path.parent.glob(f"{stem}-voicemail*.wav"))
    suffix = f"-{len(existing) + 1}" if existing else ""
    return events_path.with_name(f"{stem}-voicemail{suffix}.wav")


class VoicemailRecorder:
    def __init__(self, path: Path | None, max_s: float, end_silence_s: float):
        self.writer = WavWriter(path, 1) if path is not None else None
        self.max_frames = int(max_s * 1000 / FRAME_MS)
        self.end_silence_frames = int(end_silence_s * 1000 / FRAME_MS)
        self.frames = 0
        self.quiet_frames = 0
        self.talking = False
        self.heard_speech = False
        self._done: asyncio.Future = asyncio.get_running_loop().create_future()

    def add(self, pcm: bytes, agent_talking: bool = False) -> None:
        """One frame of the caller's line. While the agent talks over the message (a supervisor's
        typed sentence), the silence that would end it does not count: the caller is listening,
        not done."""
        if self._done.done():
            return
        if self.writer is not None:
            self.writer.append(pcm)
        self.frames += 1
        self.quiet_frames = 0 if self.talking or agent_talking else self.quiet_frames + 1
        if self.frames >= self.max_frames:
            self.finish("max_length")
        elif self.quiet_frames >= self.end_silence_frames * (1 if self.heard_speech else 2):
            self.finish("silence")

    def heard(self, event, now: float) -> None:
        """Turn-detector events while recording: they only say when the caller talks."""
        if isinstance(event, Started):
            self.talking = self.heard_speech = True
        elif isinstance(event, Ended):
            self.talking = False
            self.quiet_frames = int(event.silence_ms / FRAME_MS)

    def finish(self, reason: str) -> None:
        if not self._done.done():
            self._done.set_result(reason)

    async def done(self) -> str:
        return await self._done

    def close(self) -> float:
        if self.writer is not None:
            self.writer.close()
        return self.frames * FRAME_MS / 1000
