"""Real SIP calls over loopback: baresip and sipp call the running agent (`callcenter serve`)."""

import asyncio
import re
import shutil
import subprocess
import time
import wave

import numpy as np
import pytest

from callcenter.audio.g711 import ulaw_roundtrip
from callcenter.audio.wavfile import read_wav, write_wav
from callcenter.call.events import read_events
from callcenter.call.latency import turn_latencies
from callcenter.call.recording import repair_wav
from callcenter.call.simulate import CallerStep, simulate_call
from callcenter.lab.softphone import Softphone, caller_audio
from tests.conftest import scrape, wait_for

pytestmark = [pytest.mark.sip, pytest.mark.slow]

if not shutil.which("baresip"):
    pytest.skip("baresip is not installed (scripts/setup installs it)", allow_module_level=True)


def first_sound_s(pcm: bytes, threshold_dbfs: float = -40.0) -> float | None:
    x = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    for i in range(0, len(x) - 160, 160):
        seg = x[i : i + 160]
        if 10 * np.log10(np.mean(seg * seg) + 1e-12) > threshold_dbfs:
            return i / 8000
    return None


BILLING_WORDS = {"latest", "online", "account", "payment", "payments", "business"}
TECHNICAL_WORDS = {"technical", "support", "restart", "router", "unplugging", "seconds", "connection", "minutes"}


def heard_words(stt, pcm: bytes) -> set[str]:
    return set(re.findall(r"[a-z]+", stt.transcribe_pcm(pcm).text.lower()))


def only_call_events(agent):
    (jsonl,) = agent.calls()
    return jsonl, read_events(jsonl)


def test_billing_call_by_voice(agent, caller_voice, stt, tts, flow, tmp_path):
    """Greeting within 1.5 s, the spoken billing request answered, caller's BYE ends the call,
    and `simulate` with the same caller audio gives the same transcript."""
    bill = caller_voice("bill", "I have a question about my bill")
    mic = caller_audio([bill], tmp_path / "mic.wav", lead_s=13.0, gap_s=0, tail_s=12.0)
    with Softphone(tmp_path / "phone", mic) as phone:
        phone.dial(agent.uri)
        assert phone.wait_established(10), phone.log()
        assert phone.wait_ended(60), phone.log()
        heard = read_wav(phone.received_wav())
    onset = first_sound_s(heard)
    assert onset is not None and onset < 1.5, f"greeting started {onset} s after answer"
    reply = heard_words(stt, heard[int(14.5 * 8000) * 2 :])
    assert len(reply & BILLING_WORDS) >= 3, reply
    time.sleep(1)
    jsonl, events = only_call_events(agent)
    kinds = [e["kind"] for e in events]
    assert kinds[-1] == "call_end" and events[-1]["ended_by"] == "caller"
    decision = next(e for e in events if e["kind"] == "flow_decision")
    assert decision["intent"] == "billing" and decision["via"] == "speech"
    with wave.open(str(jsonl.with_suffix(".wav"))) as w:
        assert w.getnchannels() == 2 and w.getframerate() == 8000
        seconds = w.getnframes() / 8000
        stereo = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    assert 20 < seconds < 40
    assert np.abs(stereo[:, 0]).max() > 1000 and np.abs(stereo[:, 1]).max() > 1000  # both sides recorded

    # Prometheus's view of the same call
    m = scrape(agent)
    assert m["callcenter_calls_total"][(("transport", "sip"),)] == 1
    assert m["callcenter_calls_active"][(("transport", "sip"),)] == 0
    answered = len(turn_latencies(events))  # what `bench call` reads from the JSONL
    assert answered >= 1 and m["callcenter_turns_total"][()] == answered
    v2v = (("stage", "voice_to_voice"),)
    assert m["callcenter_turn_stage_seconds_count"][v2v] == answered
    assert 0.1 < m["callcenter_turn_stage_seconds_sum"][v2v] / answered < 3.0
    assert m["callcenter_turn_stage_seconds_bucket"][(("le", "+Inf"), ("stage", "voice_to_voice"))] == answered
    media = next(e for e in events if e["kind"] == "media")
    assert m["callcenter_frames_sent_total"][()] == media["frames_out"] > 500
    assert m["callcenter_frames_late_total"][()] == media["late_frames"]
    assert m["callcenter_resident_memory_bytes"][()] > 50e6
    assert m["callcenter_worker_restarts"][(("worker", ""),)] == 0

    # the same caller offline: her audio as the line delivered it (one G.711 µ-law trip)
    line_bill = tmp_path / "bill-ulaw.wav"
    write_wav(line_bill, ulaw_roundtrip(read_wav(bill)))
    result, _ = asyncio.run(simulate_call(flow, [CallerStep(wav=line_bill)], tmp_path / "sim", stt, tts))
    live = [(e["kind"], e["text"]) for e in events if e["kind"] in ("agent_say", "stt_final")]
    simulated = [("agent_say" if who == "agent" else "stt_final", text) for who, text in result.transcript]
    assert simulated == live


def test_keypad_2_routes_to_technical_and_bye_mid_prompt(agent, stt, tmp_path):
    mic = caller_audio([], tmp_path / "mic.wav", lead_s=60, gap_s=0, tail_s=0)
    with Softphone(tmp_path / "phone", mic) as phone:
        phone.dial(agent.uri)
        assert phone.wait_established(10), phone.log()
        time.sleep(4.0)  # during the menu prompt: the digit interrupts it
        phone.press("2")
        time.sleep(5.0)  # mid-way through the technical answer
        phone.hangup()
        assert phone.wait_ended(10), phone.log()
        heard = read_wav(phone.received_wav())
    time.sleep(1)
    jsonl, events = only_call_events(agent)
    dtmf = [e for e in events if e["kind"] == "dtmf"]
    assert [e["digit"] for e in dtmf] == ["2"]
    decision = next(e for e in events if e["kind"] == "flow_decision")
    assert decision["intent"] == "technical" and decision["via"] == "keypad"
    assert any(e["kind"] == "barge_in" and e["reason"] == "keypad" for e in events)
    reply = heard_words(stt, heard[int(dtmf[0]["t"] * 8000) * 2 :])
    assert len(reply & TECHNICAL_WORDS) >= 3, reply
    assert events[-1]["kind"] == "call_end" and events[-1]["ended_by"] == "caller"
    assert repair_wav(jsonl.with_suffix(".wav")) is False  # header already final


def test_fifth_simultaneous_call_is_rejected(agent, tmp_path):
    if not shutil.which("sipp"):
        pytest.skip("sipp is not installed")
    out = subprocess.run(
        ["sipp", "-sn", "uac", f"127.0.0.1:{agent.sip_port}", "-i", "127.0.0.1", "-p", "0", "-m", "5", "-l", "5",
         "-r", "50", "-d", "4000", "-timeout", "30", "-nostdin", "-trace_stat", "-stf", str(tmp_path / "stat.csv"),
         "-trace_err", "-error_file", str(tmp_path / "err.log")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    stat = (tmp_path / "stat.csv").read_text().splitlines()
    header, last = stat[0].split(";"), stat[-1].split(";")
    row = dict(zip(header, last))
    assert int(row["SuccessfulCall(C)"]) == 4, out.stdout[-2000:]
    assert int(row["FailedCall(C)"]) == 1
    assert "486" in (tmp_path / "err.log").read_text()
    assert "sip_call_rejected" in agent.log() or "486" in (tmp_path / "err.log").read_text()
    rejected = scrape(agent)["callcenter_calls_rejected_total"]
    assert rejected == {(("reason", "max_calls"), ("transport", "sip")): 1.0}
    assert len(agent.calls()) == 4  # four recorded calls, each ended by the caller's BYE, promptly
    assert wait_for(lambda: all(read_events(j)[-1]["kind"] == "call_end" for j in agent.calls()), 3), \
        [read_events(j)[-1]["kind"] for j in agent.calls()]
    assert all(read_events(j)[-1]["ended_by"] == "caller" for j in agent.calls())
    assert "stage_stuck_at_end" not in agent.log()  # every stage stopped when its call ended
    # the flow's fixed sentences are made in the background from the start, shared with these calls
    assert wait_for(agent.warmed, 30)


def test_kill_9_mid_call_leaves_a_playable_recording(agent, tmp_path):
    mic = caller_audio([], tmp_path / "mic.wav", lead_s=30, gap_s=0, tail_s=0)
    with Softphone(tmp_path / "phone", mic) as phone:
        phone.dial(agent.uri)
        assert phone.wait_established(10), phone.log()
        time.sleep(4.5)
        agent.kill()
    jsonl = agent.calls()[0]
    wav = jsonl.with_suffix(".wav")
    with wave.open(str(wav)) as w:  # playable as left by the crash
        assert w.getnchannels() == 2 and w.getnframes() >= 8000 * 3
    kinds = [e["kind"] for e in read_events(jsonl)]
    assert kinds[0] == "call_start" and "first_rtp_out" in kinds
    repair_wav(wav)
    with wave.open(str(wav)) as w:
        assert 4.0 <= w.getnframes() / 8000 <= 5.5
    # a restart repairs whatever is still stale, and the agent takes calls again
    agent.start()
    assert re.search(r"sip_listening", agent.log())


@pytest.mark.no_deadline  # refused at the door: signalling only
def test_calls_from_outside_the_acl_are_forbidden(tmp_path):
    if not shutil.which("sipp"):
        pytest.skip("sipp is not installed")
    from callcenter.lab.agent_process import AgentProcess
    from tests.conftest import FLOW, free_udp_port, rtp_base

    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW,
                         extra_config="acl: [10.0.0.0/8, 192.0.2.7]\n").start()
    try:
        subprocess.run(
            ["sipp", "-sn", "uac", f"127.0.0.1:{agent.sip_port}", "-i", "127.0.0.1", "-p", "0", "-m", "1",
             "-timeout", "20", "-nostdin", "-trace_err", "-error_file", str(tmp_path / "err.log")],
            capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert "SIP/2.0 403" in (tmp_path / "err.log").read_text()
        time.sleep(0.5)
        assert '"reason": "acl"' in agent.log() and agent.calls() == []
    finally:
        agent.stop()


def test_calls_back_to_back_reuse_conference_ports(agent, tmp_path):
    # 16 calls, 4 at a time, 3 s each: a finished call's port rests 2 s and then serves the next
    # call (ports are never freed under pjmedia's clock: that crashed workers in a soak)
    if not shutil.which("sipp"):
        pytest.skip("sipp is not installed")
    subprocess.run(
        ["sipp", "-sn", "uac", f"127.0.0.1:{agent.sip_port}", "-i", "127.0.0.1", "-p", "0", "-m", "16", "-l", "4",
         "-r", "4", "-d", "3000", "-timeout", "60", "-nostdin", "-trace_stat", "-stf", str(tmp_path / "stat.csv")],
        capture_output=True, text=True, timeout=90, cwd=tmp_path,
    )
    stat = (tmp_path / "stat.csv").read_text().splitlines()
    row = dict(zip(stat[0].split(";"), stat[-1].split(";")))
    assert int(row["SuccessfulCall(C)"]) == 16, agent.log()[-2000:]
    assert wait_for(lambda: len(agent.calls()) == 16 and
                    all(read_events(j)[-1]["kind"] == "call_end" for j in agent.calls()), 5)
    assert agent.proc.poll() is None and "Traceback" not in agent.log()
    assert 4 <= agent.log().count('"conference_port_created"') <= 8
    # ended calls' memory went back to the system in the background, calls unharmed
    assert wait_for(lambda: '"memory_trimmed"' in agent.log(), 5)
