"""Which voice says a prompt: settings a flow gives (per flow, per node), and the stage that speaks.

A voice is named ``backend:name``:

- ``ssm:joe``, ``ssm:awb``, ``ssm:slt`` — this project's trained state-space voices (the default is
  ``ssm:joe``); the list comes from the committed voice file;
- ``espeak:<language>`` — espeak-ng (e.g. ``espeak:en-us``, ``espeak:en-gb-scotland``).

`speed` scales the speaking rate (1.0 normal, 1.2 faster) and `pitch` shifts it in semitones.
`Speaker.stream(text, settings)` is the TTS stage a call uses: one object per process, holding one
backend per distinct setting, created on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from typing import AsyncIterator

from callcenter.audio.frames import AudioFrame
from callcenter.voice.espeak import EspeakTts, TtsError
from callcenter.voice.settings import PROMPT_CACHE_MB, VoiceSettings, voice_problem, voice_settings
from callcenter.voice.text import split_ready_sentences

PROMPT_CACHE_BYTES = PROMPT_CACHE_MB * 2**20
YIELD_EVERY_FRAMES = 50  # a cached sentence is handed over in bursts, letting other calls run between


class PromptCache:
    """Sentences already spoken in full, by (voice settings, text), least recently used dropped
    first past `max_bytes`. A contact center says the same prompts all day (greetings, menus,
    confirmations): each is synthesised once per process, not once per call."""

    def __init__(self, max_bytes: int = PROMPT_CACHE_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = 0
        self._sentences: OrderedDict[tuple, list[AudioFrame]] = OrderedDict()

    def get(self, key: tuple) -> list[AudioFrame] | None:
        frames = self._sentences.get(key)
        if frames is None:
            self.misses += 1
            return None
        self.hits += 1
        self._sentences.move_to_end(key)
        return frames

    def put(self, key: tuple, frames: list[AudioFrame]) -> None:
        size = sum(len(f.pcm) for f in frames)
        if key in self._sentences or size > self.max_bytes:
            return
        self._sentences[key] = frames
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self._sentences.popitem(last=False)
            self.bytes -= sum(len(f.pcm) for f in dropped)


class _Rendering:
    """One sentence being synthesised, heard by every call that asked for it meanwhile. It stops
    when the last of them stops listening (all barged in or hung up)."""

    def __init__(self):
        self.frames: list[AudioFrame] = []
        self.error: BaseException | None = None
        self.done = False
        self.abandoned = False  # its last listener left: a new request starts a new rendering
        self.listeners = 0
        self.task: asyncio.Task | None = None
        self._more = asyncio.Event()

    def add(self, frame: AudioFrame) -> None:
        self.frames.append(frame)
        self._wake()

    def finish(self, error: BaseException | None = None) -> None:
        self.error, self.done = error, True
        self._wake()

    def _wake(self) -> None:
        self._more.set()
        self._more = asyncio.Event()

    async def follow(self) -> AsyncIterator[AudioFrame]:
        self.listeners += 1
        at = 0
        try:
            while True:
                while at < len(self.frames):
                    yield self.frames[at]
                    at += 1
                if self.done:
                    if self.error is not None:
                        raise self.error
                    return
                await self._more.wait()
        finally:
            self.listeners -= 1
            if self.listeners == 0 and not self.done and self.task is not None:
                self.abandoned = True
                self.task.cancel()


class Speaker:
    """The TTS stage: speaks text in any voice setting; `default` when a prompt names none.
    Finished sentences are kept in a `PromptCache` (a sentence cut short by a barge-in is not)."""

    def __init__(self, default: VoiceSettings | None = None, cache: PromptCache | None = None):
        self.default = default or VoiceSettings()
        self.cache = cache if cache is not None else PromptCache()
        self._backends: dict[VoiceSettings, object] = {}
        self._rendering: dict[tuple, _Rendering] = {}
        self.backend(self.default)  # fail now, not on the first call, if the default cannot speak

    def backend(self, settings: VoiceSettings):
        if settings not in self._backends:
            problem = voice_problem(settings.name)
            if problem:
                raise TtsError(problem)
            kind, _, voice = settings.name.partition(":")
            if kind == "ssm":
                from callcenter.voice.ssm_tts import ssm_tts

                self._backends[settings] = ssm_tts(voice, settings.speed, settings.pitch)
            else:
                self._backends[settings] = EspeakTts.with_settings(voice, settings.speed, settings.pitch)
        return self._backends[settings]

    async def stream(self, text: str, settings: VoiceSettings | None = None,
                     cache: bool = True) -> AsyncIterator[AudioFrame]:
        """The sentence's frames as they are made: from the cache when it was said in full before,
        else from the rendering another call has already started (calls answered together say the
        same greeting once), else from a new rendering. `cache=False` (a sentence with a card
        number in it): synthesised for this call alone, and never kept."""
        settings = settings or self.default
        key = (settings, text)
        cached = self.cache.get(key) if cache else None
        if cached is not None:
            for i, frame in enumerate(cached):
                if i and i % YIELD_EVERY_FRAMES == 0:
                    await asyncio.sleep(0)
                yield frame
            return
        if not self.cache.max_bytes or not cache:  # caching off: every call synthesises for itself
            async for frame in self.backend(settings).stream(text):
                yield frame
            return
        rendering = self._rendering.get(key)
        if rendering is None or rendering.abandoned:
            rendering = self._rendering[key] = _Rendering()
            rendering.task = asyncio.create_task(self._render(key, rendering))
        async with contextlib.aclosing(rendering.follow()) as frames:
            async for frame in frames:
                yield frame

    async def _render(self, key: tuple, rendering: "_Rendering") -> None:
        settings, text = key
        try:
            async for frame in self.backend(settings).stream(text):
                rendering.add(frame)
            rendering.finish()
            self.cache.put(key, rendering.frames)  # only a sentence synthesised in full is kept
        except asyncio.CancelledError:  # nobody listens any more
            rendering.finish(TtsError("synthesis stopped: nobody was listening"))
        except Exception as exc:  # each listener gets it, and falls back in its own way
            rendering.finish(exc)
        finally:
            if self._rendering.get(key) is rendering:
                del self._rendering[key]

    async def stream_text(self, pieces: AsyncIterator[str],
                          settings: VoiceSettings | None = None) -> AsyncIterator[AudioFrame]:
        """Speak text that is still arriving (an LLM's streamed tokens): each sentence is spoken as
        soon as it is complete, while the next one is still being written."""
        buffer = ""
        async for piece in pieces:
            buffer += piece
            ready, buffer = split_ready_sentences(buffer)
            for sentence in ready:
                async for frame in self.stream(sentence, settings):
                    yield frame
        if buffer.strip():
            async for frame in self.stream(buffer, settings):
                yield frame


def make_tts(voice: str | VoiceSettings | None = None, cache_bytes: int = PROMPT_CACHE_BYTES) -> Speaker:
    """The speaker for a flow's default voice (`ssm:heart` when it names none)."""
    return Speaker(voice_settings(voice) or VoiceSettings(), PromptCache(cache_bytes))
