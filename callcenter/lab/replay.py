"""The call's hearing path replayed over a prepared line, in virtual time, for benchmarks and tests.

The same `Listener` a live call runs (echo canceller and noise gate, keypad, turn detector, decode
bookkeeping), and the same recognizer, see the caller's line frame by frame. The agent's prompt plays from a queue the way the
media bridge plays it: held while the caller may be interrupting, resumed after a backchannel,
dropped on a real barge-in; its echo comes back through an `EchoPath`. Each decode runs for real.
When its result arrives depends on the `DecodeClock`: `MeasuredDecodes` (benchmarks) delivers it its
measured duration later, as on a call with a free core, and so does the expectation's `finished`
judgement of a pause's text; `ModelledDecodes` (tests) delivers it a modelled time later, the same
on every machine, so that a slower CPU cannot move a turn decision the test asserts on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from callcenter.audio.frames import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, AudioFrame, float_to_pcm
from callcenter.audio.stage import Moment
from callcenter.call.caller import EchoPath
from callcenter.hearing.front import HearingConfig
from callcenter.hearing.listener import Listener
from callcenter.hearing.turns import BargeIn, Ended, Expectation, Pause, Resume, Started, Turn

TICK_S = FRAME_MS / 1000
MODELLED_DECODE_BASE_S = 0.08  # a modelled decode: this much...
MODELLED_DECODE_PER_AUDIO_S = 0.03  # ...plus this much per second of audio decoded (tiny.en on one core)
MODELLED_JUDGE_S = 0.005  # a modelled `finished` judgement of a pause's text


class MeasuredDecodes:
    """Results arrive after the time their decode (and judgement) took on this machine."""

    def decode_s(self, pcm: bytes, measured_s: float) -> float:
        return measured_s

    def judge_s(self, measured_s: float) -> float:
        return measured_s


@dataclass(frozen=True)
class ModelledDecodes:
    """Results arrive after a modelled time that depends only on the audio's length: turn decisions
    are then the same on a fast and a slow machine (what tests assert on)."""

    base_s: float = MODELLED_DECODE_BASE_S
    per_audio_s: float = MODELLED_DECODE_PER_AUDIO_S
    judge: float = MODELLED_JUDGE_S

    def decode_s(self, pcm: bytes, measured_s: float) -> float:
        return self.base_s + self.per_audio_s * len(pcm) / 2 / SAMPLE_RATE

    def judge_s(self, measured_s: float) -> float:
        return self.judge


@dataclass
class Final:
    text: str
    ready_t: float  # when the text the flow acts on was ready (it may be before the turn ended)
    turn: Turn
    ended_t: float  # when the turn ended


@dataclass
class Replayed:
    events: list[tuple[float, object]] = field(default_factory=list)
    finals: list[Final] = field(default_factory=list)
    partials: list[tuple[float, str, float]] = field(default_factory=list)
    judged: list[tuple[float, str, bool]] = field(default_factory=list)  # (when asked, text, finished)
    agent_stopped_t: float | None = None  # when the agent's voice was first held or dropped
    barge_in_t: float | None = None
    resumed: int = 0
    cpu_s: float = 0.0  # process CPU for the whole hearing path
    decodes: int = 0
    seconds: float = 0.0

    def of(self, kind) -> list[tuple[float, object]]:
        return [(t, e) for t, e in self.events if isinstance(e, kind)]


def replay(stt, caller: np.ndarray, agent: np.ndarray | None = None, expect: Expectation | None = None,
           config: HearingConfig | None = None, echo: EchoPath | None = None, tail_s: float = 2.5,
           agent_text: str = "", clock: MeasuredDecodes | ModelledDecodes | None = None) -> Replayed:
    """Run the hearing path over `caller` (float samples at 8 kHz; what the caller's side sends
    apart from the echo) while the agent plays `agent` from time 0. `clock`: when decode results
    arrive (default: after their measured time)."""
    clock = clock or MeasuredDecodes()
    listener = Listener(config)
    listener.expecting(expect or Expectation())
    listener.agent_saying(agent_text)
    out = Replayed()
    queue = [] if agent is None else [agent[i:i + FRAME_SAMPLES] for i in range(0, len(agent), FRAME_SAMPLES)]
    paused = False
    pending: list[tuple[float, Pause, object]] = []  # decodes in flight: (ready time, request, result)
    arrived: dict[tuple[int, int], float] = {}  # (turn, frames) -> when that decode's text arrived
    judging: list[tuple[float, Pause, bool]] = []  # Expectation.finished in flight: (ready time, request, verdict)
    ticks = int(np.ceil(len(caller) / FRAME_SAMPLES + tail_s / TICK_S))
    line = np.pad(caller, (0, ticks * FRAME_SAMPLES - len(caller)))
    cpu0 = time.process_time()

    def decode(pcm: bytes, t: float):
        result = stt.transcribe_pcm(pcm, SAMPLE_RATE, None, listener.expect)
        out.decodes += 1
        return t + clock.decode_s(pcm, result.seconds), result

    for tick in range(ticks):
        t = tick * TICK_S
        sent = np.zeros(FRAME_SAMPLES)
        if queue and not paused:
            chunk = queue.pop(0)
            sent[:len(chunk)] = chunk
        x = line[tick * FRAME_SAMPLES:(tick + 1) * FRAME_SAMPLES]
        if echo is not None:
            x = x + echo.frame(sent)
        played = AudioFrame(float_to_pcm(sent))
        events = listener.process(AudioFrame(float_to_pcm(x)), Moment(t, played, agent_talking=bool(queue)))
        for ready, request, result in [p for p in pending if p[0] <= t]:
            pending.remove((ready, request, result))
            out.partials.append((ready, result.text, round(result.confidence, 2)))
            arrived[(request.turn_id, request.key)] = ready
            events += listener.decoded(request.turn_id, request.key, result.text, result.confidence,
                                       result.guessed)
            finished = listener.expect.finished
            if finished is not None and not request.partial and result.text.strip() and listener.in_speech:
                t0 = time.perf_counter()  # as the call does: judged after the decode, for its measured time
                verdict = finished(result.text)
                judging.append((ready + clock.judge_s(time.perf_counter() - t0), request, verdict))
                out.judged.append((ready, result.text, verdict))
        for ready, request, verdict in [j for j in judging if j[0] <= t]:
            judging.remove((ready, request, verdict))
            events += listener.judged(request.turn_id, request.key, verdict)
        for e in events:
            out.events.append((t, e))
            if isinstance(e, Started) and e.agent_talking:
                paused = True
                out.agent_stopped_t = out.agent_stopped_t if out.agent_stopped_t is not None else t
            elif isinstance(e, BargeIn):
                queue.clear()
                paused = False
                out.barge_in_t = out.barge_in_t if out.barge_in_t is not None else t
            elif isinstance(e, Resume):
                paused = False
                out.resumed += 1
            elif isinstance(e, Pause):
                ready, result = decode(e.pcm, t)
                pending.append((ready, e, result))
            elif isinstance(e, Ended):
                out.finals.append(_final(e, t, listener.covering(e.turn), pending, decode, arrived))
    out.cpu_s = time.process_time() - cpu0
    out.seconds = ticks * TICK_S
    return out


def _final(e: Ended, t: float, covering: tuple[int, int] | None, pending, decode, arrived) -> Final:
    turn = e.turn
    if turn.text is not None:
        return Final(turn.text, arrived.get((turn.turn_id, turn.text_key), t), turn, t)
    running = [(ready, result) for ready, request, result in pending if (request.turn_id, request.key) == covering]
    if running:
        ready, result = running[-1]
        return Final(result.text, max(t, ready), turn, t)
    ready, result = decode(turn.pcm, t)
    return Final(result.text, ready, turn, t)
