"""Transfers over real SIP on loopback: a baresip caller presses 0 and reaches a person (sipp as
the person's phone). Blind: the agent REFERs the caller's phone to the person. Warm: the agent calls
the person, speaks the summary to them, then bridges the two; the person's phone echoes what it
hears (sipp -rtp_echo), so the caller hearing their own words back proves the bridge, and the
person's side of the recording holds the summary."""

import re
import shutil
import subprocess
import time
import wave

import numpy as np
import pytest

from callcenter.audio.wavfile import read_wav
from callcenter.call.events import read_events
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.softphone import Softphone, caller_audio
from tests.conftest import FLOW, free_udp_port, rtp_base

pytestmark = [pytest.mark.sip, pytest.mark.slow]

if not shutil.which("sipp") or not shutil.which("baresip"):
    pytest.skip("sipp and baresip are needed (scripts/setup installs them)", allow_module_level=True)


def person(port: int, cwd) -> subprocess.Popen:
    """A phone that answers one call and echoes its audio, until the other side hangs up."""
    return subprocess.Popen(
        ["sipp", "-sn", "uas", "-i", "127.0.0.1", "-p", str(port), "-m", "1", "-rtp_echo", "-timeout", "90",
         "-nostdin", "-trace_stat", "-stf", str(cwd / "person.csv")],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def flow_to(tmp_path, port: int, mode: str):
    text = FLOW.read_text().replace("sip:operator@127.0.0.1:5099", f"sip:operator@127.0.0.1:{port}")
    if mode == "warm":
        text = text.replace("    to: sip:operator@", "    mode: warm\n    summary: Caller from {caller} asked for "
                                                     "an operator.\n    to: sip:operator@")
    path = tmp_path / f"{mode}.yaml"
    path.write_text(text)
    return path


def person_answered(cwd) -> int:
    rows = (cwd / "person.csv").read_text().splitlines()
    row = dict(zip(rows[0].split(";"), rows[-1].split(";")))
    return int(row["SuccessfulCall(C)"])


def test_blind_transfer_reaches_the_person(tmp_path, caller_voice):
    port = free_udp_port()
    phone_of_person = person(port, tmp_path)
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), flow_to(tmp_path, port, "blind")).start()
    try:
        mic = caller_audio([], tmp_path / "mic.wav", lead_s=30, gap_s=0, tail_s=0)
        with Softphone(tmp_path / "phone", mic) as phone:
            phone.dial(agent.uri)
            assert phone.wait_established(10), phone.log()
            time.sleep(1.0)
            phone.press("0")
            assert phone._wait_log("operator@127.0.0.1", 20), phone.log()  # the phone follows the REFER
            time.sleep(3)
            phone.hangup()
        assert phone_of_person.wait(30) == 0 and person_answered(tmp_path) == 1
        time.sleep(1)
        events = read_events(agent.calls()[0])
        done = [e for e in events if e["kind"] == "transfer" and "accepted" in e]
        assert done and done[0]["accepted"] is True and done[0]["mode"] == "blind"
        assert events[-1]["kind"] == "call_end" and events[-1]["ended_by"] == "transfer"
    finally:
        agent.stop()
        if phone_of_person.poll() is None:
            phone_of_person.kill()


def test_warm_transfer_briefs_the_person_then_bridges(tmp_path, caller_voice, stt):
    port = free_udp_port()
    phone_of_person = person(port, tmp_path)
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), flow_to(tmp_path, port, "warm")).start()
    try:
        hello = caller_voice("hello_person", "Hello, is anybody there? I need help with my router.")
        # quiet while the agent greets, transfers and briefs the person; then the caller speaks
        mic = caller_audio([hello], tmp_path / "mic.wav", lead_s=22, gap_s=0, tail_s=8)
        with Softphone(tmp_path / "phone", mic) as phone:
            phone.dial(agent.uri)
            assert phone.wait_established(10), phone.log()
            time.sleep(1.0)
            phone.press("0")
            assert phone.wait_ended(60), phone.log()  # the caller's mic file ends: baresip hangs up
            heard = read_wav(phone.received_wav())
        assert phone_of_person.wait(30) == 0 and person_answered(tmp_path) == 1
        time.sleep(1)
        jsonl = agent.calls()[0]
        events = read_events(jsonl)
        summary = next(e for e in events if e["kind"] == "transfer_summary")
        assert summary["text"].startswith("Caller from sip:caller@127.0.0.1")
        done = next(e for e in events if e["kind"] == "transfer" and "accepted" in e)
        assert done["accepted"] is True and done["mode"] == "warm"
        assert events[-1]["ended_by"] == "transfer"
        # the person heard the summary: their phone echoed it, into the person's side of the recording
        with wave.open(str(jsonl.with_name(jsonl.stem + "-transfer.wav"))) as w:
            two = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
        words = set(re.findall(r"[a-z]+", stt.transcribe_pcm(two[:, 0].copy().tobytes()).text.lower()))
        assert {"operator", "asked"} & words, words
        # after the bridge the caller hears the person's phone: their own words echoed back
        bridged_at = done["t"]
        after = heard[int((bridged_at + 1) * 8000) * 2:]
        echoed = set(re.findall(r"[a-z]+", stt.transcribe_pcm(after).text.lower()))
        assert len(echoed & {"hello", "anybody", "there", "help", "router"}) >= 2, echoed
    finally:
        agent.stop()
        if phone_of_person.poll() is None:
            phone_of_person.kill()
