"""The recordings the source-filter `ssm:slt` and `ssm:awb` are cloned from: flite's own voice saying
300 lines of a contact center's speech.

flite (CMU, free licence; Debian `flite`) ships the CMU ARCTIC speakers `slt` (US English, female)
and `awb` (Scottish English, male) as voices. The first wave learnt them in the spectral model
(`ssm-voices.npz`); since 2026-12-07 each is a clone of `ssm:heart` (or, for awb, `ssm:reed`)
made by `voice clone` from what this writes: 150 agent lines (`corpus.agent_lines(150, 5151)`) and
150 conversation lines (`corpus.conversation_lines(150, 6161)`), read by flite as the simulated
caller reads them (`call.caller.speak`, 8 kHz), with `transcripts.txt`. None of these lines is one
of `bench tts`'s held-out sentences or the dev lines the settings were chosen on.

    python -m callcenter.lab.flite_speaker slt build/slt   # then: callcenter voice clone slt --from build/slt ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

LINES_EACH = 150
AGENT_SEED = 5151
CONVERSATION_SEED = 6161
VOICES = ("slt", "awb")
CREDITS = {  # written as CREDIT.txt, which `voice clone` puts in the voice file and `voice list` shows
    "slt": "flite's slt voice (CMU ARCTIC speaker slt; Carnegie Mellon University, flite's free licence)",
    "awb": "flite's awb voice (CMU ARCTIC speaker awb; Carnegie Mellon University, flite's free licence)",
}


def lines(each: int = LINES_EACH) -> list[str]:
    from callcenter.studio.voice.corpus import agent_lines, conversation_lines

    return agent_lines(each, AGENT_SEED) + conversation_lines(each, CONVERSATION_SEED)


def write_recordings(voice: str, out: Path, each: int = LINES_EACH) -> Path:
    """flite's `voice` saying `lines(each)`: l0000.wav ... and transcripts.txt in `out`."""
    from callcenter.audio.frames import float_to_pcm
    from callcenter.audio.wavfile import write_wav
    from callcenter.call.caller import speak

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, text in enumerate(lines(each)):
        write_wav(out / f"l{i:04d}.wav", float_to_pcm(speak(text, f"flite:{voice}")))
        rows.append(f"l{i:04d}: {text}")
    (out / "transcripts.txt").write_text("\n".join(rows) + "\n")
    (out / "CREDIT.txt").write_text(CREDITS[voice] + "\n")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("voice", choices=VOICES)
    p.add_argument("out", type=Path)
    args = p.parse_args()
    out = write_recordings(args.voice, args.out)
    print(f"{len(list(out.glob('*.wav')))} recordings of flite {args.voice} in {out}")


if __name__ == "__main__":
    main()
