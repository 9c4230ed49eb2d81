"""Whole calls offline: the same CallSession as a SIP call, fed from WAV files."""

import asyncio
import wave

import pytest

from callcenter.call.events import read_events
from callcenter.call.simulate import CallerStep, simulate_call

pytestmark = pytest.mark.slow


def run(flow, steps, out, stt, tts):
    return asyncio.run(simulate_call(flow, steps, out, stt, tts, call_id="sim"))


def test_spoken_billing_request_then_goodbye(flow, stt, tts, caller_voice, tmp_path):
    bill = caller_voice("bill", "I have a question about my bill")
    done = caller_voice("done", "No thanks, that's all")
    result, events = run(flow, [CallerStep(wav=bill), CallerStep(wav=done)], tmp_path, stt, tts)
    agent = [t for who, t in result.transcript if who == "agent"]
    assert agent[0] == "Thank you for calling Example Telecom."
    assert any(t.startswith("For billing") for t in agent)
    assert agent[-1].endswith("Goodbye.") and result.ended_by == "agent"
    kinds = [e["kind"] for e in read_events(tmp_path / "sim.jsonl")]
    for k in ("speech_start", "speech_end", "stt_final", "flow_decision", "tts_first_audio", "first_rtp_out"):
        assert k in kinds
    with wave.open(str(tmp_path / "sim.wav")) as w:
        assert w.getnchannels() == 2 and w.getnframes() > 8000 * 10


def test_keypad_then_operator_transfer(flow, stt, tts, tmp_path):
    result, _ = run(flow, [CallerStep(digit="2"), CallerStep(digit="0")], tmp_path, stt, tts)
    agent = [t for who, t in result.transcript if who == "agent"]
    assert any(t.startswith("For technical support") for t in agent)
    assert agent[-1] == "Please hold while I transfer you to an operator."
    assert result.ended_by == "transfer"


def test_caller_step_parsing():
    assert CallerStep.parse("dtmf:5").digit == "5"
    with pytest.raises(ValueError):
        CallerStep.parse("dtmf:55")


def test_a_node_speaks_in_its_own_voice(flow, stt, tts, tmp_path):
    from callcenter.voice.speaker import VoiceSettings

    nodes = dict(flow.nodes)
    nodes["technical_answer"] = nodes["technical_answer"].model_copy(
        update={"voice": VoiceSettings(name="ssm:awb", speed=1.1)})
    result, _ = run(flow.model_copy(update={"nodes": nodes}), [CallerStep(digit="2"), CallerStep(digit="0")],
                    tmp_path, stt, tts)
    says = [e for e in read_events(tmp_path / "sim.jsonl") if e["kind"] == "agent_say"]
    assert says[0]["voice"] == "ssm:joe"
    assert [e["voice"] for e in says if e["text"].startswith("For technical")] == ["ssm:awb"]
    assert result.ended_by == "transfer"
