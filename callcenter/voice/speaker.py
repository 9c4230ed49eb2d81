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

from typing import AsyncIterator

from pydantic import BaseModel, ConfigDict, Field

from callcenter.audio.frames import AudioFrame
from callcenter.voice.espeak import EspeakTts, TtsError
from callcenter.voice.text import split_ready_sentences

DEFAULT_VOICE = "ssm:joe"
BACKENDS = ("ssm", "espeak")


class VoiceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(DEFAULT_VOICE, description="backend:voice, e.g. ssm:joe, ssm:awb, ssm:slt, espeak:en-us")
    speed: float = Field(1.0, ge=0.5, le=2.0, description="Speaking rate; 1.0 is normal, 1.2 is 20 % faster.")
    pitch: float = Field(0.0, ge=-12, le=12, description="Pitch shift in semitones.")


def voice_settings(value) -> VoiceSettings | None:
    """A flow's `voice:` — a name ('ssm:awb') or a mapping (name, speed, pitch) — as settings."""
    if value is None or isinstance(value, VoiceSettings):
        return value
    if isinstance(value, str):
        return VoiceSettings(name=value)
    return VoiceSettings(**value)


def _ssm_voices() -> list[str]:
    """The voices in the committed voice file (raises VoiceFileError if it cannot be read)."""
    from callcenter.voice.ssm_tts import load_voices

    return [f"ssm:{v}" for v in load_voices().voices]


def known_voices() -> list[str]:
    """The voices this installation can speak with (ssm voices from the voice file; espeak-ng as a family)."""
    from callcenter.voice.runtime import VoiceFileError

    try:
        names = _ssm_voices()
    except VoiceFileError:  # no readable voice file: the ssm backend is unavailable
        names = []
    return names + ["espeak:<language>"]


def voice_problem(name: str) -> str | None:
    """Why `name` cannot be spoken with here, or None."""
    from callcenter.voice.runtime import VoiceFileError

    backend, _, voice = name.partition(":")
    if backend not in BACKENDS or not voice:
        return f"unknown voice {name!r}: expected one of {', '.join(known_voices())}"
    if backend == "ssm":
        try:
            ssm = _ssm_voices()
        except VoiceFileError as exc:
            return f"voice {name!r} cannot be loaded: {exc}"
        if name not in ssm:
            return f"unknown voice {name!r}: this installation has {', '.join(ssm + ['espeak:<language>'])}"
    return None


class Speaker:
    """The TTS stage: speaks text in any voice setting; `default` when a prompt names none."""

    def __init__(self, default: VoiceSettings | None = None):
        self.default = default or VoiceSettings()
        self._backends: dict[VoiceSettings, object] = {}
        self.backend(self.default)  # fail now, not on the first call, if the default cannot speak

    def backend(self, settings: VoiceSettings):
        if settings not in self._backends:
            problem = voice_problem(settings.name)
            if problem:
                raise TtsError(problem)
            kind, _, voice = settings.name.partition(":")
            if kind == "ssm":
                from callcenter.voice.ssm_tts import SsmTts

                self._backends[settings] = SsmTts(voice, settings.speed, settings.pitch)
            else:
                self._backends[settings] = EspeakTts.with_settings(voice, settings.speed, settings.pitch)
        return self._backends[settings]

    async def stream(self, text: str, settings: VoiceSettings | None = None) -> AsyncIterator[AudioFrame]:
        async for frame in self.backend(settings or self.default).stream(text):
            yield frame

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


def make_tts(voice: str | VoiceSettings | None = None) -> Speaker:
    """The speaker for a flow's default voice (`ssm:joe` when it names none)."""
    return Speaker(voice_settings(voice) or VoiceSettings())
