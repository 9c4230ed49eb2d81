"""Turn endpointing: decides when the caller started and finished speaking."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from callcenter.audio.frames import FRAME_MS, AudioFrame
from callcenter.hearing.vad import VAD_WINDOW_MS, SileroVad


@dataclass
class EndpointConfig:
    threshold: float = 0.5  # speech probability that counts as speech
    start_ms: float = 64  # speech needed to declare the caller started (barge-in reacts on this)
    end_silence_ms: float = 700  # silence that ends the turn
    min_speech_ms: float = 160  # a blip shorter than this is dropped, not a turn
    preroll_ms: float = 300  # audio kept from before the start so the first phoneme is not clipped
    max_turn_s: float = 30.0  # a turn never grows beyond this


@dataclass
class Turn:
    """One endpointed stretch of caller speech."""

    pcm: bytes
    started_at: float
    ended_at: float

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 2 / 8000


class Endpointer:
    """Feeds 20 ms frames to the VAD and reports `("start", t)` and `("end", Turn)` decisions."""

    def __init__(self, config: EndpointConfig | None = None, vad: SileroVad | None = None) -> None:
        self.config = config or EndpointConfig()
        self.vad = vad or SileroVad()
        self._preroll: deque[AudioFrame] = deque(maxlen=max(1, int(self.config.preroll_ms // FRAME_MS)))
        self._reset_turn()

    def _reset_turn(self) -> None:
        self.in_speech = False
        self._speech_run_ms = 0.0
        self._silence_run_ms = 0.0
        self._voiced_ms = 0.0
        self._turn_frames: list[AudioFrame] = []
        self._start_t = 0.0

    def set_end_silence(self, ms: float) -> None:
        self.config.end_silence_ms = ms

    def process(self, frame: AudioFrame, t: float) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        probs = self.vad.feed(frame.as_float())
        if self.in_speech:
            self._turn_frames.append(frame)
        else:
            self._preroll.append(frame)
        for p in probs:
            speech = p >= self.config.threshold
            if not self.in_speech:
                self._speech_run_ms = self._speech_run_ms + VAD_WINDOW_MS if speech else 0.0
                if self._speech_run_ms >= self.config.start_ms:
                    self.in_speech = True
                    self._start_t = t - self._speech_run_ms / 1000
                    self._voiced_ms = self._speech_run_ms
                    self._silence_run_ms = 0.0
                    self._turn_frames = list(self._preroll)
                    self._preroll.clear()
                    out.append(("start", self._start_t))
            else:
                if speech:
                    self._silence_run_ms = 0.0
                    self._voiced_ms += VAD_WINDOW_MS
                else:
                    self._silence_run_ms += VAD_WINDOW_MS
                turn_s = len(self._turn_frames) * FRAME_MS / 1000
                if self._silence_run_ms >= self.config.end_silence_ms or turn_s >= self.config.max_turn_s:
                    frames = self._turn_frames
                    voiced = self._voiced_ms
                    start = self._start_t
                    self._reset_turn()
                    if voiced >= self.config.min_speech_ms:
                        pcm = b"".join(f.pcm for f in frames)
                        out.append(("end", Turn(pcm, start, t)))
                    else:
                        out.append(("discard", start))
        return out

    def reset(self) -> None:
        self.vad.reset()
        self._preroll.clear()
        self._reset_turn()

