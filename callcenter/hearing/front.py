"""The caller side's front end: echo cancellation against what the agent sent, then the streaming
noise gate. Turn-taking decides on the gate's output; the recognizer hears the echo-cancelled line
(or the gated one, where `bench stt` shows that lowers WER)."""

from __future__ import annotations

from dataclasses import dataclass, field

from callcenter.audio.frames import AudioFrame
from callcenter.hearing.denoise import Denoiser
from callcenter.hearing.echo import EchoCanceller
from callcenter.hearing.turns import TurnConfig


@dataclass
class HearingConfig:
    turns: TurnConfig = field(default_factory=TurnConfig)
    echo_cancel: bool = True
    denoise_vad: bool = True  # turn-taking and barge-in decide on the noise gate's output
    denoise_stt: bool = False  # the recognizer hears the gate's output too


class LineFront:
    """One call's front end: `process(caller, reference)` -> (frame for the recognizer, frame for VAD);
    `echo_floor` is the power of the agent's echo that may remain in them."""

    def __init__(self, config: HearingConfig | None = None):
        self.config = config or HearingConfig()
        self.echo = EchoCanceller() if self.config.echo_cancel else None
        need_gate = self.config.denoise_vad or self.config.denoise_stt
        self.denoiser = Denoiser() if need_gate else None
        self.echo_floor = 0.0

    def process(self, caller: AudioFrame, reference: bytes | None,
                caller_talking: bool = False) -> tuple[AudioFrame, AudioFrame | None]:
        frame = self.echo.process(caller, reference, learn=not caller_talking) if self.echo else caller
        self.echo_floor = self.echo.echo_floor if self.echo else 0.0
        gated = self.denoiser.process(frame) if self.denoiser else None
        stt = gated if self.config.denoise_stt and gated is not None else frame
        vad = gated if self.config.denoise_vad else None
        return stt, vad
