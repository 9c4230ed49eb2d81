"""The caller side's front end: echo cancellation against what the agent sent, then (optionally) the
streaming noise gate, for turn-taking (`denoise_vad`) and for the recognizer (`denoise_stt`).

Both are off by default because `callcenter bench stt` measured them as no better: with the noise
floor in the turn detector, deciding on the gated line gave the same zero false barge-ins but
missed more interruptions (25 % vs 20 % in 10 dB babble), took 20-40 ms longer to stop the agent
and let more backchannels through (20 % vs 10 %); the recognizer's WER was better gated only on
clean and µ-law lines (6.3 % vs 6.8-8.6 %) and worse in babble (46 % vs 42 % at 10 dB)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from callcenter.audio.frames import AudioFrame
from callcenter.audio.stage import Moment
from callcenter.hearing.denoise import Denoiser
from callcenter.hearing.echo import EchoCanceller
from callcenter.hearing.turns import TurnConfig


@dataclass
class HearingConfig:
    turns: TurnConfig = field(default_factory=TurnConfig)
    echo_cancel: bool = True
    denoise_vad: bool = False  # turn-taking and barge-in decide on the noise gate's output
    denoise_stt: bool = False  # the recognizer hears the gate's output


class LineFront:
    """One call's front end: `process(frame, at)` -> (the frame for the recognizer, `at` with what the
    front learnt: `echo_floor`, the power of the agent's echo that may remain, and `decide_on`, the
    gated line when speech decisions hear the noise gate)."""

    def __init__(self, config: HearingConfig | None = None):
        self.config = config or HearingConfig()
        self.echo = EchoCanceller() if self.config.echo_cancel else None
        need_gate = self.config.denoise_vad or self.config.denoise_stt
        self.denoiser = Denoiser() if need_gate else None
        self.echo_floor = 0.0

    def process(self, frame: AudioFrame, at: Moment) -> tuple[AudioFrame, Moment]:
        frame = self.echo.process(frame, at) if self.echo else frame
        self.echo_floor = self.echo.echo_floor if self.echo else 0.0
        gated = self.denoiser.process(frame, at) if self.denoiser else None
        stt = gated if self.config.denoise_stt and gated is not None else frame
        vad = gated if self.config.denoise_vad else None
        return stt, replace(at, echo_floor=self.echo_floor, decide_on=vad)
