"""Whole calls offline: the same CallSession as a SIP call, fed from WAV files."""

import asyncio
import wave
from pathlib import Path

import pytest

from callcenter.call.events import read_events
from callcenter.call.simulate import CallerStep, simulate_call

pytestmark = pytest.mark.slow


def run(flow, steps, out, stt, tts, real_time: bool = False):
    """A simulated call, on the virtual clock unless `real_time` (the test below shows both give
    the same call)."""
    from callcenter.call.virtual_clock import run_virtual

    call = simulate_call(flow, steps, out, stt, tts, call_id="sim")
    return asyncio.run(call) if real_time else run_virtual(call)


def test_spoken_billing_request_then_goodbye(flow, stt, tts, caller_voice, tmp_path):
    bill = caller_voice("bill", "I have a question about my bill")
    done = caller_voice("done", "No thanks, that's all")
    result, events = run(flow, [CallerStep(wav=bill), CallerStep(wav=done)], tmp_path, stt, tts)
    agent = [t for who, t in result.transcript if who == "agent"]
    assert agent[0] == "Thank you for calling Example Telecom."
    assert any(t.startswith("For billing") for t in agent)
    assert agent[-1].endswith("Goodbye.") and result.ended_by == "agent"
    kinds = [e["kind"] for e in read_events(tmp_path / "sim.jsonl")]
    for k in ("speech_start", "speech_end", "stt_final", "flow_decision", "tts_first_audio", "first_rtp_out",
              "first_sound_out"):
        assert k in kinds
    from callcenter.call.latency import turn_latencies

    turns = turn_latencies(read_events(tmp_path / "sim.jsonl"))
    assert turns and all(t["voice_to_voice"] <= t["voice_to_sound"] < t["voice_to_voice"] + 0.1 for t in turns)
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
    from callcenter.voice.settings import VoiceSettings

    nodes = dict(flow.nodes)
    nodes["technical_answer"] = nodes["technical_answer"].model_copy(
        update={"voice": VoiceSettings(name="ssm:awb", speed=1.1)})
    result, _ = run(flow.model_copy(update={"nodes": nodes}), [CallerStep(digit="2"), CallerStep(digit="0")],
                    tmp_path, stt, tts)
    says = [e for e in read_events(tmp_path / "sim.jsonl") if e["kind"] == "agent_say"]
    assert says[0]["voice"] == "ssm:heart"
    assert [e["voice"] for e in says if e["text"].startswith("For technical")] == ["ssm:awb"]
    assert result.ended_by == "transfer"


def test_echo_of_the_agent_is_not_a_caller(flow, stt, tts, tmp_path):
    """The agent's own voice comes back 15 dB down on the caller's line: no pause, no barge-in."""
    from callcenter.call.caller import EchoPath
    from callcenter.call.virtual_clock import run_virtual

    result, _ = run_virtual(simulate_call(flow, [CallerStep(digit="1"), CallerStep(digit="2")], tmp_path, stt,
                                          tts, call_id="sim", echo=EchoPath(gain_db=-15)))
    kinds = [e["kind"] for e in read_events(tmp_path / "sim.jsonl")]
    assert "agent_paused" not in kinds and "barge_in" not in kinds and "stt_final" not in kinds
    assert result.ended_by == "agent"


def test_caller_talking_over_the_prompt_interrupts_it(flow, stt, tts, caller_voice, tmp_path):
    talk = caller_voice("tech", "I need technical support, my internet is down")
    result, _ = run(flow, [CallerStep(wav=talk, over_s=1.5), CallerStep(digit="0")], tmp_path, stt, tts)
    events = read_events(tmp_path / "sim.jsonl")
    kinds = [e["kind"] for e in events]
    assert kinds.index("agent_paused") < kinds.index("barge_in")
    decisions = [e for e in events if e["kind"] == "flow_decision" and e.get("via") == "speech"]
    assert decisions and decisions[0]["intent"] == "technical"
    # the caller spoke 1.5 s into the greeting: the menu prompt queued after it was dropped unspoken
    agent = [t for who, t in result.transcript if who == "agent"]
    assert agent[0].startswith("Thank you for calling") and agent[1].startswith("For technical support")


def test_backchannel_over_the_prompt_lets_it_finish(flow, stt, tts, caller_voice, tmp_path):
    okay = caller_voice("okay", "Okay.")
    result, _ = run(flow, [CallerStep(wav=okay, over_s=1.5), CallerStep(digit="0")], tmp_path, stt, tts)
    events = read_events(tmp_path / "sim.jsonl")
    kinds = [e["kind"] for e in events]
    assert "agent_paused" in kinds and "agent_resumed" in kinds and "barge_in" not in kinds
    assert result.ended_by == "transfer"



@pytest.mark.parametrize("how", ["spoken", "keyed"])
def test_account_number_spoken_or_keyed(how, stt, tts, caller_voice, tmp_path):
    from callcenter.dialog.flow import load_flow

    flow = load_flow(Path(__file__).parent / "flows" / "account.yaml")
    if how == "spoken":
        steps = [CallerStep(wav=caller_voice("acct", "four seven two, nine one eight three"))]
    else:
        steps = [CallerStep(digit=d) for d in "4729183#"]
    run(flow, steps, tmp_path, stt, tts)
    decisions = [e for e in read_events(tmp_path / "sim.jsonl") if e["kind"] == "flow_decision"]
    captured = [d for d in decisions if d["intent"] == "number"]
    assert captured and captured[0]["value"] == "4729183" and captured[0]["next_node"] == "confirm"


def test_keypad_tones_in_the_audio_work_like_keypad_events(flow, stt, tts, tmp_path):
    """A caller whose phone sends no RFC 4733 events: the keys arrive as tones in the audio."""
    result, _ = run(flow, [CallerStep.parse("tone:2"), CallerStep.parse("tone:0")], tmp_path, stt, tts)
    events = read_events(tmp_path / "sim.jsonl")
    keys = [(e["digit"], e["source"]) for e in events if e["kind"] == "dtmf"]
    assert keys == [("2", "inband"), ("0", "inband")]
    assert "stt_final" not in [e["kind"] for e in events]  # the tones were not taken for speech
    agent = [t for who, t in result.transcript if who == "agent"]
    assert any(t.startswith("For technical support") for t in agent) and result.ended_by == "transfer"


def test_one_key_heard_both_ways_counts_once(flow, stt, tts, tmp_path):
    from callcenter.call.bridge import MediaBridge
    from callcenter.call.events import CallEvents
    from callcenter.call.session import CallSession
    from callcenter.call.simulate import SimulatedLine

    async def main():
        loop = asyncio.get_running_loop()
        events = CallEvents("dedup")
        session = CallSession("dedup", flow, MediaBridge(loop), SimulatedLine(), events, stt, tts)
        session.on_dtmf("1")
        session.on_dtmf("1", source="inband")
        session.on_dtmf("A", source="inband")
        await asyncio.sleep(0.05)
        return [(e.data["digit"], e.data.get("ignored", False)) for e in events.history if e.kind == "dtmf"]

    assert asyncio.run(main()) == [("1", False), ("A", True)]


def test_a_say_nodes_pause_is_silence_on_the_line(tmp_path, stt, tts):
    from callcenter.dialog.flow import load_flow

    (tmp_path / "f.yaml").write_text(
        "name: p\nvoice: ssm:joe\nstart: a\nnodes:\n"
        "  a: {type: say, text: One., pause_ms: 1500, next: b}\n"
        "  b: {type: hangup, text: Two.}\n")
    flow = load_flow(tmp_path / "f.yaml")
    result, events = asyncio.run(simulate_call(flow, [], tmp_path / "out", stt, tts, call_id="pause"))
    done_one = next(e.t for e in events.history if e.kind == "playout_done" and e.data["utterance"] == 1)
    say_two = next(e.t for e in events.history if e.kind == "agent_say" and e.data["text"] == "Two.")
    assert 1.4 <= say_two - done_one < 2.5 and result.ended_by == "agent"


def voiced_spans(path: Path, channel: int = 1) -> list[tuple[float, float]]:
    """(start, end) seconds of the agent's voice in a call recording: 20 ms frames over -45 dBFS,
    gaps under 200 ms (a stop's closure) bridged."""
    import numpy as np

    with wave.open(str(path)) as w:
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)[:, channel] / 32768.0
    frames = x[: len(x) // 160 * 160].reshape(-1, 160)
    loud = 10 * np.log10((frames ** 2).mean(1) + 1e-12) > -45
    spans: list[list[float]] = []
    for i in np.flatnonzero(loud):
        t = i * 0.02
        if spans and t - spans[-1][1] < 0.2:
            spans[-1][1] = t + 0.02
        else:
            spans.append([t, t + 0.02])
    return [(a, b) for a, b in spans]


def test_the_agent_speaks_without_dead_air_and_pauses_between_sentences(tmp_path, stt, tts):
    """The voice opens each sentence with ~0.3 s of silence: kept between two sentences said back
    to back (the pause between them), not added to a flow's pause or before the greeting."""
    from callcenter.dialog.flow import load_flow

    (tmp_path / "f.yaml").write_text(
        "name: p\nambience: clean\nstart: a\nnodes:\n"
        "  a: {type: say, text: Hello., next: b}\n"
        "  b: {type: say, text: Goodbye., pause_ms: 1000, next: c}\n"
        "  c: {type: hangup, text: Thanks.}\n")
    flow = load_flow(tmp_path / "f.yaml")
    _, events = run(flow, [], tmp_path / "out", stt, tts)
    # the line's own account: each utterance's first frame out and its first frame with sound in it
    first = {e.data["utterance"]: e.t for e in events.history if e.kind == "first_rtp_out"}
    sound = {e.data["utterance"]: e.t for e in events.history if e.kind == "first_sound_out"}
    assert sorted(sound) == [1, 2, 3]
    assert sound[1] - first[1] < 0.1 and sound[3] - first[3] < 0.1  # after a quiet line: at once
    assert sound[2] - first[2] > 0.25  # back to back: the pause goes out as silence
    spans = voiced_spans(tmp_path / "out" / "sim.wav")
    assert len(spans) == 3, spans
    (s1, e1), (s2, e2), (s3, _) = spans
    # (before: 0.30 s, 0.68 s and 1.70 s)
    assert s1 < 0.15  # the greeting's first sound comes at once, not after its opening silence
    assert 0.5 < s2 - e1 < 0.9  # the pause between two sentences is the voice's own (its end and opening)
    assert 1.0 <= s3 - e2 < 1.55  # a flow's 1 s pause: the sentence's end, the pause, and no opening silence


def test_a_refused_supervisor_transfer_leaves_the_call_going(flow, stt, tts):
    from callcenter.call.bridge import MediaBridge
    from callcenter.call.events import CallEvents
    from callcenter.call.session import CallSession
    from callcenter.call.simulate import SimulatedLine, _play_out

    async def main():
        bridge = MediaBridge(asyncio.get_running_loop())
        events = CallEvents("sup")
        session = CallSession("sup", flow, bridge, SimulatedLine(accept_transfer=False), events, stt, tts)
        clock = asyncio.create_task(_play_out(bridge))
        run = asyncio.create_task(session.run())
        await asyncio.sleep(0.5)
        session.supervisor_transfer("sip:desk@127.0.0.1")
        await asyncio.sleep(1.0)
        ended_early = session.ended.is_set()
        session.supervisor_say("I'm still here with you.")
        await asyncio.sleep(2.0)
        session.end("caller")
        result = await run
        clock.cancel()
        return ended_early, result, events.history

    ended_early, result, history = asyncio.run(main())
    transfer = [e.data for e in history if e.kind == "transfer" and "accepted" in e.data]
    assert not ended_early and transfer == [{"to": "sip:desk@127.0.0.1", "mode": "blind", "accepted": False}]
    assert any(e.kind == "agent_say" and e.data["text"] == "I'm still here with you." for e in history)
    assert result.ended_by == "caller"


def test_a_recorded_prompt_is_played_instead_of_the_voice(stt, tts, caller_voice, tmp_path):
    """A voice talent's greeting (here a flite recording at 16 kHz) is what the caller hears, sample
    for sample after resampling once at load; the transcript still shows the node's text."""
    import subprocess
    import textwrap

    import numpy as np

    from callcenter.audio.wavfile import read_wav
    from callcenter.dialog.flow import load_flow
    from callcenter.yamlfile import UserFileError

    (tmp_path / "prompts").mkdir()
    talent = tmp_path / "prompts" / "greeting.wav"
    subprocess.run(["flite", "-voice", "slt", "-t", "Welcome to the pharmacy.", "-o", str(talent)], check=True)
    text = textwrap.dedent("""\
        name: recorded
        start: greet
        nodes:
          greet:
            type: say
            text: Welcome to the pharmacy.
            audio: prompts/greeting.wav
            next: bye
          bye:
            type: hangup
            text: Goodbye.
        """)
    (tmp_path / "flow.yaml").write_text(text)
    flow = load_flow(tmp_path / "flow.yaml")
    result, _ = run(flow, [], tmp_path / "out", stt, tts)
    assert [t for who, t in result.transcript if who == "agent"] == ["Welcome to the pharmacy.", "Goodbye."]
    with wave.open(str(tmp_path / "out" / "sim.wav")) as w:
        agent = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)[:, 1]
    played = np.frombuffer(read_wav(talent), "<i2")
    start = int(np.flatnonzero(np.abs(agent) > 200)[0])
    head = np.flatnonzero(np.abs(played) > 200)[0]
    assert np.array_equal(agent[start:start + 4000], played[head:head + 4000])  # the recording, untouched

    (tmp_path / "flow.yaml").write_text(text.replace("prompts/greeting.wav", "prompts/missing.wav"))
    with pytest.raises(UserFileError, match=r"flow.yaml:7:5: recorded prompt: .*missing.wav: no such file"):
        load_flow(tmp_path / "flow.yaml")


def test_the_virtual_clock_gives_the_same_call_in_a_fraction_of_the_time(flow, stt, tts, caller_voice, tmp_path):
    import time

    from callcenter.call.virtual_clock import run_virtual

    bill = caller_voice("bill", "I have a question about my bill")
    done = caller_voice("done", "No thanks, that's all")
    steps = [CallerStep(wav=bill), CallerStep(digit="1"), CallerStep(wav=done)]
    t0 = time.monotonic()
    real, _ = run(flow, steps, tmp_path / "real", stt, tts, real_time=True)
    real_s = time.monotonic() - t0
    t0 = time.monotonic()
    fast, _ = run_virtual(simulate_call(flow, steps, tmp_path / "fast", stt, tts, call_id="sim"))
    fast_s = time.monotonic() - t0

    def story(folder):
        return [(e["kind"], e.get("text"), e.get("intent"), e.get("node"), e.get("digit"))
                for e in read_events(folder / "sim.jsonl") if e["kind"] != "stt_partial"]

    assert story(tmp_path / "fast") == story(tmp_path / "real")
    assert fast.transcript == real.transcript and fast.ended_by == real.ended_by
    call_s = read_events(tmp_path / "fast" / "sim.jsonl")[-1]["t"]
    assert call_s > 15 and fast_s < real_s / 3, (call_s, fast_s, real_s)  # a 20 s call in seconds


def test_a_look_for_the_console_waits_for_no_one(flow, stt, tts):
    """A partial decode while the caller talks and the agent does not is only for the console: it
    is left out while the recognizer is busy with other calls; over the agent it is always made
    (its text may settle an interruption). So is a second look at a pause (`recheck`), and the
    turn's end does not wait for one left out."""
    import threading

    from callcenter.call.bridge import MediaBridge
    from callcenter.call.events import CallEvents
    from callcenter.call.session import CallSession
    from callcenter.call.simulate import SimulatedLine
    from callcenter.hearing.decoding import DecodeExecutor
    from callcenter.hearing.turns import Pause, Turn

    async def main():
        session = CallSession("look", flow, MediaBridge(asyncio.get_running_loop()), SimulatedLine(),
                              CallEvents("look"), stt, tts)
        session.hearing.decoder = DecodeExecutor(workers=1)
        gate = threading.Event()
        session.hearing.decoder.submit(gate.wait)  # another call's decode holds the recognizer
        pcm = bytes(3200)
        session.hearing.start_decode(Pause(pcm, 1, 10, partial=True))
        session.hearing.start_decode(Pause(pcm, 1, 12, partial=True, over_agent=True))
        for pause in (Pause(pcm, 2, 14, partial=False), Pause(pcm, 2, 30, partial=False, recheck=True)):
            session.hearing.listener._requested.add((pause.turn_id, pause.key))  # as the listener asks for them
            session.hearing.start_decode(pause)
        covering = session.hearing.listener.covering(Turn(pcm, 0.0, 1.0, turn_id=2, voiced_frames=14))
        busy = set(session.hearing.decodes)
        gate.set()
        await session.hearing.decodes[(1, 12)]  # queued after the pause's (more urgent) decode
        assert not session.hearing.decoder.busy
        session.hearing.start_decode(Pause(pcm, 3, 30, partial=False, recheck=True))
        await session.hearing.decodes[(3, 30)]
        session.hearing.start_decode(Pause(pcm, 4, 10, partial=True))
        idle = set(session.hearing.decodes) - busy
        await asyncio.gather(*session.hearing.decodes.values(), return_exceptions=True)
        session.hearing.decoder.shutdown()
        return busy, idle, covering

    busy, idle, covering = asyncio.run(main())
    assert busy == {(1, 12), (2, 14)} and idle == {(3, 30), (4, 10)}
    assert covering == (2, 14)  # the pause's decode in flight, not the second look left out
