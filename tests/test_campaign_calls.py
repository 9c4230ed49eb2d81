"""A campaign through a real server: `callcenter campaign start`, the worker's dialer sends the
contacts' numbers to a trunk (a raw SIP far end that answers, is busy or rings, by number) in each
contact's calling window (the campaign clock set by CALLCENTER_NOW), skips the do-not-call list,
retries on schedule, and `campaign status` gives every contact one final result."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from callcenter.lab.agent_process import AgentProcess
from callcenter.supervisor.client import request
from tests.conftest import FLOW, free_tcp_port, free_udp_port, rtp_base, wait_for
from tests.sipraw import RawUas, header

pytestmark = [pytest.mark.sip, pytest.mark.slow, pytest.mark.no_deadline]  # signalling, no audio judged

if not shutil.which("baresip"):
    pytest.skip("baresip is not installed (scripts/setup installs it)", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
ZONES = ("America/New_York", "Europe/Berlin", "Asia/Tokyo")  # at the clock below: 11:30, 17:30, 01:30
CONTACTS = [(f"+1555060{i:02d}", ZONES[i % 3]) for i in range(9)]
DNC = "+155506003"  # New York, in its window: never dialled all the same
FAR_END = {"0": "answer", "1": "busy", "4": "ring", "3": "answer", "6": "answer", "7": "busy"}


def test_a_campaign_dials_in_windows_skips_do_not_call_and_retries(tmp_path):
    trunk = RawUas(lambda user: FAR_END.get(user[-1], "answer"), hold_s=1.0)
    cfg_extra = (f"outbound:\n  flows: {{reminder: {ROOT / 'flows/reminder.yaml'}}}\n  allow: ['+1555*']\n"
                 f"  trunk: 127.0.0.1:{trunk.port}\n  caller_id: '+14155550100'\n  ring_s: 2\n")
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                         token="t", extra_config=cfg_extra,
                         env={"CALLCENTER_NOW": "2026-12-07T16:30:00+00:00"}).start()
    (tmp_path / "contacts.csv").write_text("number,timezone,name\n" + "".join(
        f"{n},{z},Person{i}\n" for i, (n, z) in enumerate(CONTACTS)))
    (tmp_path / "dnc.txt").write_text(DNC + "\n")
    (tmp_path / "c.yaml").write_text(textwrap.dedent("""
        name: rehearsal
        flow: reminder
        contacts: contacts.csv
        do_not_call: dnc.txt
        windows: [{days: [mon, tue, wed, thu, fri], from: "09:00", to: "20:00"}]
        attempts: 2
        retry_s: {no_answer: 1, busy: 1, failed: 1}
        pace: {max_concurrent: 2, calls_per_second: 2}
        caller_id: "+14155550199"
        """))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "callcenter.cli", "campaign", *args, "--config",
                               str(agent.config)], capture_output=True, text=True, timeout=60)

    def status() -> dict:
        run = cli("status", "rehearsal", "--json", str(tmp_path / "s.json"))
        assert run.returncode == 0, run.stderr
        return json.loads((tmp_path / "s.json").read_text())

    try:
        assert cli("start", str(tmp_path / "c.yaml")).returncode == 0
        in_window = [n for n, z in CONTACTS if z != "Asia/Tokyo"]
        assert wait_for(lambda: sum(c["state"] == "done" for c in status()["contacts"]) == len(in_window), 60), \
            (status(), agent.log()[-3000:])
        final = status()
        board = request(agent.control_url + "/api/campaigns", "t")["campaigns"]  # what the console shows
    finally:
        agent.stop()
        trunk.close()
    results = {c["number"]: c for c in final["contacts"]}
    for number, zone in CONTACTS:
        user, c = number, results[number]
        if zone == "Asia/Tokyo":
            assert trunk.invites_to(user) == 0 and c["state"] == "pending", c
        elif number == DNC:
            assert trunk.invites_to(user) == 0 and c["result"] == "dnc_skipped", c
        elif FAR_END.get(number[-1]) in ("busy", "ring"):
            assert trunk.invites_to(user) == 2 and c["attempts"] == 2, (c, trunk.invites_to(user))
            assert c["result"] == {"busy": "busy", "ring": "no_answer"}[FAR_END[number[-1]]], c
        else:  # answered, the flow spoke, the far end hung up
            assert trunk.invites_to(user) == 1 and c["result"] == "caller_hung_up", c
    counts = final["counts"]
    assert counts["dnc_skipped"] == 1 and counts["remaining"] == 3
    invites = [r for r in trunk.requests if r.startswith(b"INVITE")]
    assert invites and all(header(r, "P-Asserted-Identity") == "<tel:+14155550199>" for r in invites)
    assert final["campaign"]["state"] == "running"  # the Tokyo contacts wait for their morning
    assert [(c["name"], c["counts"]) for c in board] == [("rehearsal", counts)]
