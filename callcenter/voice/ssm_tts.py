"""The SSM voices as a streaming TTS stage (`ssm:<voice>`): text in, 20 ms frames out.

A prompt is split into sentences and pauses (`text.speech_chunks`). Each sentence is phonemized and
planned (milliseconds), then the decoder runs step by step in a worker thread and every step's
samples are handed to the loop at once, so the first frame leaves after one step, not after the
sentence. Closing the stream (barge-in cancels the consumer) stops the worker before its next step.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import AsyncIterator

import numpy as np

from callcenter.audio.frames import SAMPLE_RATE, AudioFrame, FrameChunker, float_to_pcm
from callcenter.voice.phonemes import Phonemizer, phoneme_ids
from callcenter.voice.runtime import VOICES_FILE, SsmVoices
from callcenter.voice.text import speech_chunks

MAX_STREAMS = 16          # worker threads: concurrent utterances being synthesised in this process
_executor = ThreadPoolExecutor(MAX_STREAMS, thread_name_prefix="ssm-tts")
_loaded: dict[str, SsmVoices] = {}
_load_lock = threading.Lock()
_END = object()


def load_voices(path=VOICES_FILE) -> SsmVoices:
    """The process-wide model (loaded once, shared by every call and voice)."""
    key = str(path)
    with _load_lock:
        if key not in _loaded:
            _loaded[key] = SsmVoices(path)
        return _loaded[key]


SF_PREFIX = "sf-"  # a source-filter voice file is sf-<voice>.npz (sf_runtime)
SHIPPED_VOICE_DIR = VOICES_FILE.parent
VOICE_DIR_ENV = "CALLCENTER_VOICE_DIR"  # where `voice clone` writes, and speaking looks, for cloned voices


def user_voice_dir() -> Path:
    return Path(os.environ.get(VOICE_DIR_ENV) or Path.home() / ".local" / "share" / "callcenter" / "voices")


def sf_voice_files() -> dict[str, Path]:
    """Source-filter voices: the shipped ones, then those cloned on this machine (a cloned voice
    never hides a shipped one of the same name)."""
    found: dict[str, Path] = {}
    for folder in (SHIPPED_VOICE_DIR, user_voice_dir()):
        if folder.is_dir():
            for path in sorted(folder.glob(f"{SF_PREFIX}*.npz")):
                found.setdefault(path.stem[len(SF_PREFIX):], path)
    return found


def sf_voices() -> list[str]:
    """The source-filter voices whose weights this installation has."""
    return list(sf_voice_files())


def voice_names() -> list[str]:
    """Every ssm voice here, each name once: the spectral file's, then the source-filter ones; a
    source-filter voice of a spectral voice's name replaces it (`ssm_tts` speaks that one)."""
    return list(dict.fromkeys(load_voices().voices + sf_voices()))


def sf_voice_problem(voice: str) -> str | None:
    """Why the source-filter voice `voice` cannot speak here (a derived voice whose base is gone),
    or None; reads metadata only."""
    path = sf_voice_files().get(voice)
    if path is None:
        return None
    from callcenter.voice.runtime import VoiceFileError
    from callcenter.voice.sf_runtime import DERIVED, base_voice_file, read_meta

    try:
        meta = read_meta(path)
        if meta.get("kind") == DERIVED:
            base_voice_file(meta, path)
    except VoiceFileError as exc:
        return f"voice 'ssm:{voice}' cannot be loaded: {exc}"
    return None


def ssm_tts(voice: str, speed: float = 1.0, pitch: float = 0.0) -> "SsmTts":
    """The streaming stage for `ssm:<voice>`: a source-filter voice if it is one, else a voice of
    the spectral model file."""
    files = sf_voice_files()
    if voice in files:
        from callcenter.voice.sf_runtime import load_sf_voice

        return SfTts(voice, speed, pitch, voices=load_sf_voice(files[voice]))
    return SsmTts(voice, speed, pitch)


class SsmTts:
    name = "ssm"

    def __init__(self, voice: str, speed: float = 1.0, pitch: float = 0.0, voices: SsmVoices | None = None,
                 language: str = "en-us"):
        self.voices = voices or load_voices()
        self.voice = voice
        self.voice_index = self.voices.voice_index(voice)
        self.speed = speed
        self.pitch = pitch
        self.phonemizer = Phonemizer(language)

    def samples(self, text: str, stop: threading.Event):
        """Blocking generator of float32 sample chunks for `text`, pauses included."""
        for chunk in speech_chunks(text):
            if stop.is_set():
                return
            if chunk.pause_ms:
                yield np.zeros(chunk.pause_ms * SAMPLE_RATE // 1000, np.float32)
                continue
            yield from self.sentence(chunk.text, stop)

    def sentence(self, text: str, stop: threading.Event):
        ids = phoneme_ids(self.phonemizer.phonemes(text))
        cond = self.voices.plan(ids, self.voice_index, self.speed, self.pitch)
        yield from self.voices.stream(cond, cancelled=stop.is_set)

    async def stream(self, text: str) -> AsyncIterator[AudioFrame]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()

        def produce():
            try:
                for samples in self.samples(text, stop):
                    loop.call_soon_threadsafe(queue.put_nowait, samples)
            except Exception as exc:  # handed to the consumer, raised there
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _END)

        worker = loop.run_in_executor(_executor, produce)
        chunker = FrameChunker()
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, Exception):
                    raise item
                for frame in chunker.push(float_to_pcm(item)):
                    yield frame
            for frame in chunker.flush():
                yield frame
        finally:
            stop.set()
            if not worker.done():
                worker.add_done_callback(lambda f: f.exception())


class SfTts(SsmTts):
    """A source-filter SSM voice (`sf_runtime`): hibari's phonemes (its G2P, Apache-2.0), our
    normalised text, the decoder streamed step by step. Same `samples`/`stream` contract."""

    def __init__(self, voice: str, speed: float = 1.0, pitch: float = 0.0, voices=None, language: str = "en-us"):
        from callcenter.voice.sf_runtime import load_sf_voice

        self.voices = voices or load_sf_voice(sf_voice_files()[voice])
        self.voice = voice
        self.speed = speed
        self.pitch = pitch
        self.g2p = self.voices.g2p()

    def sentence(self, text: str, stop: threading.Event):
        for ids in self.g2p(text):
            yield from self.voices.stream(self.voices.plan(ids, self.speed), cancelled=stop.is_set, pitch=self.pitch)
