"""What a flow or a config says about the voice and the line's ambience, as typed models. No signal
code here: `flows check` and the config loaders import this, never numpy's DSP, scipy or a model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from callcenter.memory import PROMPT_CACHE_MB  # noqa: F401  (where the config and the voice's cache read it)

DEFAULT_VOICE = "ssm:heart"  # beats ssm:joe on WER, DNSMOS, RTF and first audio (bench tts)
BACKENDS = ("ssm", "espeak")

class VoiceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(DEFAULT_VOICE, description="backend:voice, e.g. ssm:heart, ssm:reed, ssm:kumo, ssm:allison, espeak:en-us")
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
    from callcenter.voice.ssm_tts import voice_names

    return [f"ssm:{v}" for v in voice_names()]


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
        from callcenter.voice.ssm_tts import sf_voice_problem

        return sf_voice_problem(voice)
    return None


class AmbienceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: Literal["clean", "office", "callcenter", "mobile"] = "clean"
    enabled: bool = True
    band_limit: bool | None = Field(None, description="Telephone band 300-3400 Hz.")
    mulaw: bool | None = Field(None, description="G.711 µ-law companding character.")
    hiss_db: float | None = Field(None, le=-20, description="Line hiss level, dBFS (omit for the preset's).")
    hum_db: float | None = Field(None, le=-20, description="Mains hum level, dBFS.")
    hum_hz: Literal[50, 60] = 50
    comfort_db: float | None = Field(None, le=-20, description="Comfort noise while the agent is silent, dBFS.")
    bed: Literal["none", "office", "callcenter"] | None = None
    bed_db: float | None = Field(None, le=-10, description="Background bed level, dBFS.")
    duck_db: float | None = Field(None, ge=0, le=60, description="How far the bed drops under the voice, dB.")

    def resolved(self) -> dict:
        """The preset with this setting's overrides applied (None = off)."""
        values = dict(PRESETS[self.preset])
        for key in values:
            mine = getattr(self, key)
            if mine is not None:
                values[key] = mine
        values["hum_hz"] = self.hum_hz
        return values


OFF = dict(band_limit=False, mulaw=False, hiss_db=None, hum_db=None, comfort_db=None, bed="none",
           bed_db=None, duck_db=12.0)
PRESETS: dict[str, dict] = {
    "clean": OFF,
    "office": {**OFF, "band_limit": True, "hiss_db": -68.0, "comfort_db": -70.0, "bed": "office",
               "bed_db": -50.0, "duck_db": 12.0},
    "callcenter": {**OFF, "band_limit": True, "hiss_db": -66.0, "comfort_db": -68.0, "bed": "callcenter",
                   "bed_db": -44.0, "duck_db": 12.0},
    "mobile": {**OFF, "band_limit": True, "mulaw": True, "hiss_db": -58.0, "hum_db": -62.0,
               "comfort_db": -60.0},
}


def ambience_settings(value) -> AmbienceSettings:
    if value is None:
        return AmbienceSettings()
    if isinstance(value, AmbienceSettings):
        return value
    if isinstance(value, str):
        return AmbienceSettings(preset=value)
    return AmbienceSettings(**value)
