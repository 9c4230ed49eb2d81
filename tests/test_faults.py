"""A part of the agent fails mid-call: the recognizer raises or stalls, the voice raises or stalls, a
stage's loop crashes. Whole calls offline (the same CallSession as a live one); the caller must hear
something within a second of the failure, never more than 2 s of dead air, and be transferred or told
to call back."""

import asyncio
import threading

import pytest

from callcenter.call.events import read_events
from callcenter.call.session import STT_GIVE_UP_S
from callcenter.call.simulate import CallerStep, SimulatedLine, simulate_call
from callcenter.dialog.flow import load_flow
from tests.conftest import FLOW

pytestmark = pytest.mark.slow

OPERATOR = "sip:operator@127.0.0.1:5099"


class BrokenStt:
    """The real recognizer, made to raise or to hang (until released) on every decode."""

    def __init__(self, real, mode: str):
        self.real, self.mode = real, mode
        self.release = threading.Event()

    def transcribe_pcm(self, pcm, rate=8000, hint=None, grammar=None):
        if self.mode == "raise":
            raise RuntimeError("recognizer crashed")
        self.release.wait(20)
        return self.real.transcribe_pcm(pcm, rate, hint, grammar)


class BrokenTts:
    """The flow's voice, made to raise or to hang before its first frame."""

    def __init__(self, mode: str):
        self.mode = mode

    async def stream(self, text, settings=None):
        if self.mode == "raise":
            raise RuntimeError("voice model crashed")
        await asyncio.sleep(30)
        yield None  # never reached


def call(flow, steps, tmp_path, stt, tts, line=None):
    result, _ = asyncio.run(simulate_call(flow, steps, tmp_path, stt, tts, call_id="f", line=line))
    return result, read_events(tmp_path / "f.jsonl")


def audio_spans(events):
    """(start, end) of each stretch of agent audio on the line, in call time."""
    starts = {e["utterance"]: e["t"] for e in events if e["kind"] == "first_rtp_out"}
    ends = {e["utterance"]: e["t"] for e in events if e["kind"] == "playout_done"}
    return sorted((starts[u], ends.get(u, starts[u])) for u in starts)


def longest_silence_after(events, t0: float) -> float:
    """Longest stretch without agent audio from t0 to the end of the call."""
    end = events[-1]["t"]
    gaps, cursor = [], t0
    for a, b in audio_spans(events):
        if b <= t0:
            continue
        gaps.append(max(0.0, a - cursor))
        cursor = max(cursor, b)
    gaps.append(max(0.0, end - cursor - 0.5))  # the hang-up grace after the last words
    return max(gaps)


def first_audio_after(events, t0: float) -> float:
    return min(a for a, _ in audio_spans(events) if a >= t0) - t0


def trouble_flow(tmp_path, transfer: bool):
    text = FLOW.read_text()
    if transfer:
        text = text.replace("start: greet", f"start: greet\ntrouble:\n  transfer_to: {OPERATOR}")
    path = tmp_path / "flow.yaml"
    path.write_text(text)
    return load_flow(path)


@pytest.mark.parametrize("transfer", [False, True])
def test_recognizer_that_raises(tmp_path, stt, tts, caller_voice, transfer):
    flow = trouble_flow(tmp_path, transfer)
    line = SimulatedLine()
    result, events = call(flow, [CallerStep(wav=caller_voice("bill", "I have a question about my bill"))],
                          tmp_path, BrokenStt(stt, "raise"), tts, line)
    end = next(e for e in events if e["kind"] == "speech_end")
    trouble = next(e for e in events if e["kind"] == "trouble")
    assert trouble["stage"] == "stt"
    said = [e["text"] for e in events if e["kind"] == "agent_say"]
    assert said[-1].startswith("I'm sorry, we're having technical trouble.")
    assert first_audio_after(events, end["last_voice_t"]) < 1.0 + (end["t"] - end["last_voice_t"])
    assert longest_silence_after(events, end["t"]) < 2.0
    if transfer:
        assert result.ended_by == "transfer" and line.transferred_to == OPERATOR
        assert "put you through" in said[-1]
    else:
        assert result.ended_by == "agent" and said[-1].endswith("Goodbye.")


def test_recognizer_that_stalls_gets_one_moment_then_the_trouble_path(tmp_path, stt, tts, caller_voice, flow):
    broken = BrokenStt(stt, "stall")
    try:
        result, events = call(flow, [CallerStep(wav=caller_voice("bill", "I have a question about my bill"))],
                              tmp_path, broken, tts)
    finally:
        broken.release.set()
    end = next(e for e in events if e["kind"] == "speech_end")
    slow = next(e for e in events if e["kind"] == "stage_slow")
    trouble = next(e for e in events if e["kind"] == "trouble")
    said = [e["text"] for e in events if e["kind"] == "agent_say"]
    assert "One moment, please." in said and said[-1].endswith("Goodbye.")
    assert slow["t"] - end["t"] < 1.3 and trouble["t"] - end["t"] < STT_GIVE_UP_S + 0.3
    assert first_audio_after(events, end["t"]) < 1.3
    assert longest_silence_after(events, end["t"]) < 2.0
    assert result.ended_by == "agent"


@pytest.mark.parametrize("mode", ["raise", "stall"])
def test_a_voice_that_fails_is_replaced_by_the_backup_voice(tmp_path, stt, flow, mode):
    result, events = call(flow, [CallerStep(digit="0")], tmp_path, stt, BrokenTts(mode))
    fallbacks = [e for e in events if e["kind"] == "stage_fallback"]
    assert fallbacks and fallbacks[0]["stage"] == "tts" and fallbacks[0]["to"] == "espeak:en-us"
    says = {e["utterance"]: e["t"] for e in events if e["kind"] == "agent_say"}
    firsts = {e["utterance"]: e["t"] for e in events if e["kind"] == "first_rtp_out"}
    assert firsts.keys() == says.keys()  # every prompt was heard
    assert max(firsts[u] - says[u] for u in says) < 1.0
    # the flow went on as usual: the keypad's 0 reaches the operator
    assert [e.get("intent") for e in events if e["kind"] == "flow_decision"] == ["operator"]
    assert result.ended_by == "transfer"


def test_a_crashed_hearing_loop_ends_the_call_with_words_not_silence(tmp_path, stt, tts, flow, monkeypatch):
    from callcenter.hearing.front import LineFront

    real = LineFront.process
    frames = {"n": 0}

    def process(self, *args, **kwargs):
        frames["n"] += 1
        if frames["n"] == 150:  # 3 s into the call, during the menu prompt
            raise RuntimeError("denoiser crashed")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LineFront, "process", process)
    result, events = call(flow, [CallerStep(silence_s=10)], tmp_path, stt, tts)
    error = next(e for e in events if e["kind"] == "error")
    assert error["stage"] == "hear"
    trouble = next(e for e in events if e["kind"] == "trouble")
    assert first_audio_after(events, trouble["t"]) < 1.0
    assert [e["text"] for e in events if e["kind"] == "agent_say"][-1].endswith("Goodbye.")
    assert result.ended_by == "agent"


@pytest.mark.parametrize("ticks", range(8))
def test_a_voice_cancelled_as_a_frame_arrives_stops_at_once(ticks):
    # barge-in and hang-up cancel the synthesis task; whatever loop tick the cancel lands on (here
    # every one of the first few, including the one where the next frame has just been produced)
    # the voice must end there, and its source be closed, instead of speaking on
    from callcenter.call.session import unless_stalled

    produced, closed = [], []

    async def voice():
        try:
            for i in range(1000):
                await asyncio.sleep(0)
                produced.append(i)
                yield i
        finally:
            closed.append(True)

    async def speak(heard):
        async for frame in unless_stalled(voice(), 1.0, 1.0):
            heard.append(frame)

    async def main():
        heard = []
        task = asyncio.create_task(speak(heard))
        for _ in range(ticks + 1):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return heard

    heard = asyncio.run(main())
    assert len(heard) <= ticks and len(produced) <= ticks + 1 and closed == [True]
