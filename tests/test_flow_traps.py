"""Traps a first-time flow author fell into (the dentist's-office build), each on a live SIP call
where that is where it bit: a slot named like an internal keyword (`at`) and a date of birth that
lost its year."""

from __future__ import annotations

import re
import shutil
import time

import pytest

from callcenter.call.events import read_events
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.softphone import Softphone, caller_audio
from tests.conftest import ROOT, free_udp_port, rtp_base

needs_sip = pytest.mark.skipif(not shutil.which("baresip") or not shutil.which("flite"),
                               reason="baresip and flite are needed")

DENTIST = """
name: dentist
hours: {timezone: Europe/Berlin, open: {mon-sun: "00:00-23:59"}}
start: dob
nodes:
  dob:
    type: ask
    prompt: Please tell me your date of birth.
    on_failure: bye
    timeout_s: 10
    slots:
      born: {type: date, when: past}
    next: readback
  readback:
    type: say
    text: Thank you. I have {born}.
    next: bye
  bye: {type: hangup, text: Goodbye.}
"""


@needs_sip
@pytest.mark.sip
@pytest.mark.slow
def test_a_slot_named_at_books_on_a_live_call(tmp_path, caller_voice):
    """flows/appointments.yaml's `at` slot once crashed the turn (emit's own `at=`): the caller
    heard 5 s of silence. Now the read-back is said, and the decision's event keeps the slot."""
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), ROOT / "flows" / "appointments.yaml").start()
    said = caller_voice("tuesday_1030", "Next Tuesday at ten thirty in the morning.")
    try:
        mic = caller_audio([said], tmp_path / "mic.wav", lead_s=6, gap_s=0, tail_s=12)
        with Softphone(tmp_path / "caller", mic) as phone:
            phone.dial(agent.uri)
            assert phone.wait_established(10), phone.log()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                    e["kind"] == "agent_say" and "Shall I book it" in e["text"]
                    for p in agent.calls() for e in read_events(p)):
                time.sleep(0.3)
            phone.hangup()
        events = read_events(agent.calls()[0])
        assert not [e for e in events if e["kind"] in ("error", "trouble")], events
        assert '"task_failed"' not in agent.log()
        decision = next(e for e in events if e["kind"] == "flow_decision" and e.get("next_node") == "confirm")
        assert re.fullmatch(r"1[01]:[0-5]\d", decision["at"]) and isinstance(decision["t"], float)
        assert any(e["kind"] == "agent_say" and f"at {decision['at']}. Shall I book it" in e["text"] for e in events), \
            [e.get("text") for e in events if e["kind"] == "agent_say"]
    finally:
        agent.stop()


@needs_sip
@pytest.mark.sip
@pytest.mark.slow
def test_a_date_of_birth_keeps_its_year_on_a_live_call(tmp_path, caller_voice):
    flow = tmp_path / "dentist.yaml"
    flow.write_text(DENTIST)
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), flow).start()
    said = caller_voice("dob_1985", "The fourth of March, nineteen eighty five.")
    try:
        mic = caller_audio([said], tmp_path / "mic.wav", lead_s=5, gap_s=0, tail_s=10)
        with Softphone(tmp_path / "caller", mic) as phone:
            phone.dial(agent.uri)
            assert phone.wait_established(10), phone.log()
            assert phone.wait_ended(40), phone.log()
        events = read_events(agent.calls()[0])
        assert any(e["kind"] == "agent_say" and "1985-03-04" in e["text"] for e in events), \
            [(e["kind"], e.get("text")) for e in events if e["kind"] in ("agent_say", "stt_final")]
    finally:
        agent.stop()
