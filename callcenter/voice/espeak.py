"""espeak-ng as a streaming TTS backend (`espeak`): a child process per utterance, its WAV on a pipe
resampled to 8 kHz as it arrives, so the first frame leaves long before the sentence is rendered.
Cancelling kills the child at once."""

from __future__ import annotations

import asyncio
import re
import shutil
import struct
from typing import AsyncIterator

import numpy as np
import soxr

from callcenter.audio.frames import SAMPLE_RATE, AudioFrame, FrameChunker
from callcenter.errors import CallcenterError

ESPEAK_BINARIES = ("espeak-ng", "espeak")
DEFAULT_VOICE = "en-us"
DEFAULT_WPM = 160
DEFAULT_PITCH = 50
PITCH_PER_SEMITONE = 4
WAV_HEADER_BYTES = 44
READ_BYTES = 4096


class TtsError(CallcenterError, RuntimeError):
    pass


def espeak_binary() -> str:
    for name in ESPEAK_BINARIES:
        path = shutil.which(name)
        if path:
            return path
    raise TtsError("espeak-ng is not installed (apt-get install espeak-ng)")


def espeak_text(text: str) -> str:
    """The prompt as espeak-ng should read it: our normalization and pause markup applied."""
    from callcenter.voice.text import speech_chunks

    return " ".join(re.sub(r"[<>&]", " ", c.text) if not c.pause_ms else f"<break time=\"{c.pause_ms}ms\"/>"
                    for c in speech_chunks(text))


class EspeakTts:
    name = "espeak"

    def __init__(self, voice: str = DEFAULT_VOICE, wpm: int = DEFAULT_WPM, pitch: int = DEFAULT_PITCH):
        self.binary = espeak_binary()
        self.voice = voice
        self.wpm = wpm
        self.pitch = pitch

    @classmethod
    def with_settings(cls, voice: str, speed: float = 1.0, semitones: float = 0.0) -> "EspeakTts":
        """Speed as a rate factor and pitch in semitones, mapped onto espeak-ng's wpm and 0-99 pitch."""
        pitch = int(min(99, max(0, DEFAULT_PITCH + semitones * PITCH_PER_SEMITONE)))
        return cls(voice, int(DEFAULT_WPM * speed), pitch)

    async def stream(self, text: str) -> AsyncIterator[AudioFrame]:
        """Yield 20 ms frames of `text` spoken, as soon as espeak-ng produces them."""
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--stdout", "-m", "-v", self.voice, "-s", str(self.wpm), "-p", str(self.pitch),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            proc.stdin.write(espeak_text(text).encode("utf-8") + b"\n")
            await proc.stdin.drain()
            proc.stdin.close()
            header = await proc.stdout.readexactly(WAV_HEADER_BYTES)
            if header[:4] != b"RIFF":
                raise TtsError("espeak-ng did not produce a WAV stream")
            src_rate = struct.unpack_from("<I", header, 24)[0]
            resampler = soxr.ResampleStream(src_rate, SAMPLE_RATE, 1, dtype="int16", quality="HQ")
            chunker = FrameChunker()
            odd = b""
            while True:
                data = await proc.stdout.read(READ_BYTES)
                last = not data
                data = odd + data
                odd = data[len(data) & ~1 :]
                data = data[: len(data) & ~1]
                pcm = np.frombuffer(data, dtype="<i2")
                out = resampler.resample_chunk(pcm, last=last)
                for frame in chunker.push(out.astype("<i2").tobytes()):
                    yield frame
                if last:
                    break
            for frame in chunker.flush():
                yield frame
            rc = await proc.wait()
            if rc != 0:
                err = (await proc.stderr.read()).decode(errors="replace").strip()
                raise TtsError(f"espeak-ng failed ({rc}): {err}")
        except asyncio.IncompleteReadError:
            err = (await proc.stderr.read()).decode(errors="replace").strip()
            raise TtsError(f"espeak-ng produced no audio: {err or 'unknown voice?'}") from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
