"""`callcenter dial` against a running server: a phone that is busy, one that rings and is never
answered, and the dials the server refuses. Raw SIP on loopback, no audio on a deadline (the
offline shard); the answered call with its audio is in test_outbound_calls.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from callcenter.lab.agent_process import AgentProcess
from callcenter.store.calls import CallRecords
from callcenter.store.db import open_database
from tests.conftest import FLOW, free_tcp_port, free_udp_port, rtp_base
from tests.sipraw import RawUas, header

pytestmark = [pytest.mark.sip, pytest.mark.slow]

if not shutil.which("baresip"):
    pytest.skip("baresip is not installed (scripts/setup installs it)", allow_module_level=True)

TOKEN = "dial-token-7c1"
ROOT = Path(__file__).resolve().parent.parent
RING_S = 3


def outbound_config(allow: str) -> str:
    return (f"outbound:\n  flows: {{reminder: {ROOT / 'flows/reminder.yaml'}}}\n  allow: [{allow}]\n"
            f"  deny: ['+1555000*']\n  trunk: 127.0.0.1:9\n  caller_id: '+14155550100'\n  ring_s: {RING_S}\n")


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    proc = AgentProcess(tmp_path_factory.mktemp("dialler"), free_udp_port(), rtp_base(), FLOW,
                        control_port=free_tcp_port(), token=TOKEN,
                        extra_config=outbound_config("'sip:*@127.0.0.1:*', '+1555*'")).start()
    yield proc
    proc.stop()


def dial(agent, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "callcenter.cli", "dial", *args, "--connect", agent.control_url,
                           "--timeout", "60"], capture_output=True, text=True, timeout=90,
                          env=dict(os.environ, CALLCENTER_TOKEN=TOKEN))


def row(agent, call_id: str) -> dict:
    rows = [c for c in CallRecords(open_database(agent.store), "", "").between(0, 2**40) if c["call_id"] == call_id]
    assert len(rows) == 1, rows
    return rows[0]


def test_a_busy_phone_is_busy_and_gets_our_caller_id(agent):
    phone = RawUas("busy")
    try:
        run = dial(agent, phone.uri("dana"), "--flow", "reminder", "--var", "name=Dana", "--wait")
    finally:
        phone.close()
    assert run.returncode == 1, run.stderr
    call_id, result = run.stdout.split("\n")[0], json.loads(run.stdout.strip().split("\n")[-1])
    assert result["outcome"] == "busy" and result["sip_code"] == 486 and result["state"] == "ended"
    invite = phone.requests[0]
    assert invite.startswith(b"INVITE sip:dana@127.0.0.1:")
    assert header(invite, "P-Asserted-Identity") == "<tel:+14155550100>"
    r = row(agent, call_id)
    assert r["direction"] == "outbound" and r["outcome"] == "busy" and r["answered"] is None and r["ended"]


def test_a_phone_nobody_answers_is_cancelled_after_ring_s(agent):
    phone = RawUas("ring")
    try:
        run = dial(agent, phone.uri("sam"), "--flow", "reminder", "--wait")
        methods = [r.split(b" ", 1)[0] for r in phone.requests]
    finally:
        phone.close()
    assert run.returncode == 1, run.stderr
    result = json.loads(run.stdout.strip().split("\n")[-1])
    assert result["outcome"] == "no_answer" and result["sip_code"] == 487
    assert RING_S - 0.5 <= result["age_s"] <= RING_S + 5
    assert methods[:2] == [b"INVITE", b"CANCEL"], methods
    assert row(agent, result["call_id"])["outcome"] == "no_answer"


@pytest.mark.parametrize("args, words", [
    (["sip:dana@10.1.2.3", "--flow", "reminder"], "matches no pattern in outbound.allow"),
    (["+15550001234", "--flow", "reminder"], "refused by outbound.deny"),
    (["sip:dana@127.0.0.1:5999", "--flow", "nosuch"], "no outbound flow 'nosuch'"),
    (["sip:dana@127.0.0.1:5999", "--flow", "reminder", "--var", "caller=x"], "set by the call itself"),
    (["sip:dana@127.0.0.1:5999", "--flow", "reminder", "--var", "clinicname=x"], "declares no variable"),
])
def test_what_the_server_will_not_dial_is_refused_with_why(agent, args, words):
    run = dial(agent, *args)
    assert run.returncode == 2 and words in run.stderr and not run.stdout, (run.stdout, run.stderr)


def test_without_the_token_or_an_outbound_section_nothing_is_dialled(agent, tmp_path):
    run = subprocess.run([sys.executable, "-m", "callcenter.cli", "dial", "sip:a@127.0.0.1:5999", "--flow", "reminder",
                          "--connect", agent.control_url, "--recordings", str(tmp_path)],
                         capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "CALLCENTER_TOKEN"})
    assert run.returncode == 2 and "no API token" in run.stderr
    (tmp_path / "t").write_text("wrong\n")
    run = subprocess.run([sys.executable, "-m", "callcenter.cli", "dial", "sip:a@127.0.0.1:5999", "--flow", "reminder",
                          "--connect", agent.control_url, "--token-file", str(tmp_path / "t")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "401" in run.stderr
