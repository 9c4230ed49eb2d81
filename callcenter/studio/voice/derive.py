"""A voice derived from another source-filter voice (`callcenter voice derive`): the same network,
its F0 moved by some semitones and its spectral envelopes warped in frequency, so its formants sit
where a longer or shorter vocal tract puts them. No training and no new weights: the file names its
base voice and the two numbers (`sf_runtime.DERIVED`), and the decoder's envelopes go through one
48x48 matrix per frame (`source_filter.formant_warp`).

From a woman's voice to a man's the textbook ratios are about an octave less one to three semitones
in F0 and 0.8-0.87 in formant frequencies. ssm:reed is ssm:heart at -10 semitones and 0.84: its F0
median is 107 Hz (heart's 191 Hz). It keeps heart's articulation and intonation, so it speaks as
clearly as heart and DNSMOS rates it as heart (bench tts), which the spectral male voice ssm:joe
does not reach.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from callcenter.errors import CallcenterError

PITCH_RANGE = (-12.0, 12.0)  # semitones
FORMANT_RANGE = (0.75, 1.3)  # past these the warp smears vowels into each other
LEVEL_LINES = 12  # agent lines both voices say to match the derived voice's level to its base's
LEVEL_SEED = 2718


class DeriveError(CallcenterError, ValueError):
    """A derived voice asked for wrongly."""


def resolve(base: str, pitch: float, formant: float) -> tuple[str, float, float]:
    """The base voice with weights, and the pitch and formant ratio relative to it: a derived base
    is replaced by its own base, the moves combined. Raises DeriveError."""
    from callcenter.voice.sf_runtime import DERIVED, read_meta
    from callcenter.voice.ssm_tts import sf_voice_files

    name = base.removeprefix("ssm:")
    files = sf_voice_files()
    if name not in files:
        raise DeriveError(f"--from {base}: not a source-filter voice here; derive from one of "
                          + ", ".join(f"ssm:{v}" for v in files))
    meta = read_meta(files[name])
    if meta.get("kind") == DERIVED:
        name, pitch, formant = meta["base"], pitch + float(meta["pitch"]), formant * float(meta["formant"])
    lo, hi = PITCH_RANGE
    if not lo <= pitch <= hi:
        raise DeriveError(f"pitch {pitch:+g} semitones from ssm:{name}: expected {lo:g} to {hi:g}")
    lo, hi = FORMANT_RANGE
    if not lo <= formant <= hi:
        raise DeriveError(f"formant ratio {formant:g} from ssm:{name}: expected {lo:g} to {hi:g}")
    return name, round(pitch, 3), round(formant, 4)


def derive(name: str, base: str, pitch: float, formant: float, out: Path) -> dict:
    """Write `out`, the voice ssm:`name`: ssm:`base` with its pitch moved `pitch` semitones and its
    formants at `formant` times their frequency, at its base's speaking level. Returns what it
    wrote (base, pitch, formant, gain)."""
    from callcenter.studio.voice.clone import speaking_level
    from callcenter.studio.voice.corpus import agent_lines
    from callcenter.voice.sf_runtime import SfVoice, export_derived, set_gain
    from callcenter.voice.ssm_tts import sf_voice_files

    base, pitch, formant = resolve(base, pitch, formant)
    source = SfVoice(sf_voice_files()[base])
    out.parent.mkdir(parents=True, exist_ok=True)
    export_derived(out, base, pitch, formant, {"name": name})
    voice = SfVoice(out)  # not the cache: the file changes below
    # lowering F0 keeps the voiced power (source_filter.harmonic_level) but the warp moves energy
    # across the band; the level is matched as a clone's is (clone.speaking_level), on the same lines
    lines, g2p = agent_lines(LEVEL_LINES, LEVEL_SEED), voice.g2p()
    ours, theirs = ([speaking_level(say(v, g2p, text)) for text in lines] for v in (voice, source))
    gain = round(float(source.meta.get("gain", 1.0)) * float(np.sqrt(np.median(theirs) / np.median(ours))), 4)
    set_gain(out, gain)
    return {"base": base, "pitch": pitch, "formant": formant, "gain": gain}


def say(voice, g2p, text: str) -> np.ndarray:
    """`text` in `voice` (an SfVoice; `g2p` its `g2p()`), whole."""
    parts = [np.concatenate([np.zeros(0, np.float32), *voice.stream(voice.plan(ids))]) for ids in g2p(text)]
    return np.concatenate([np.zeros(0, np.float32), *parts])
