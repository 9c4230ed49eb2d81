"""The one contract of every per-frame stage of a call: `process(frame, at) -> out`.

`frame` is always one `AudioFrame` (20 ms of 8 kHz PCM). `at` is a `Moment`: what the call knows
about those same 20 ms besides the frame itself (the time, what the agent sent out, who is talking,
how much of the agent's echo may remain). A stage reads the fields it needs and ignores the others;
a stage that learns something a later stage needs hands on a new `Moment` (`dataclasses.replace`),
so data flows one way, frame by frame, as in Pipecat's frame processors.

What each stage returns is its own job: a filter returns a frame (`EchoCanceller`, `Denoiser`,
`Ambience`), a detector returns what it detected (`InbandDtmf`: digits, `TurnDetector`: turn
events), and the line front returns the frame for the recognizer with the `Moment` it learnt.

Not stages in this sense, by design: the transports' resamplers (48 kHz arrays, before a frame
exists), `FrameChunker` (makes frames), and the VAD model inside the turn detector (32 ms windows).
`tests/test_layers.py` checks every class listed in `STAGES` keeps the signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from callcenter.audio.frames import AudioFrame

Out = TypeVar("Out", covariant=True)


@dataclass(frozen=True, slots=True)
class Moment:
    """What is known about the 20 ms a stage is given, besides the frame itself."""

    t: float = 0.0  # seconds on the call's clock at this frame
    played: AudioFrame | None = None  # what the agent sent out during the same 20 ms (echo reference)
    agent_talking: bool = False  # the agent's voice is on the line
    caller_talking: bool = False  # turn-taking is inside a caller's turn (echo filter: do not adapt)
    echo_floor: float = 0.0  # power of the agent's echo that may remain in the frame
    decide_on: AudioFrame | None = None  # the line speech decisions hear (noise gate), when not `frame`


class FrameStage(Protocol[Out]):
    def process(self, frame: AudioFrame, at: Moment) -> Out: ...


# every per-frame stage, as "module:Class" (checked by tests/test_layers.py without importing DSP here)
STAGES = (
    "callcenter.hearing.echo:EchoCanceller",
    "callcenter.hearing.denoise:Denoiser",
    "callcenter.hearing.dtmf:InbandDtmf",
    "callcenter.hearing.front:LineFront",
    "callcenter.hearing.turns:TurnDetector",
    "callcenter.hearing.amd:AnsweringMachineDetector",
    "callcenter.hearing.listener:Listener",
    "callcenter.voice.ambience:Ambience",
)

__all__ = ["Moment", "FrameStage", "STAGES"]
