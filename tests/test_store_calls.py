"""Real SIP calls and the store: each call's row says how it ended, on PostgreSQL, even when the
database restarts in the middle of the call; a store that cannot be reached at start is one line."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from callcenter.lab.agent_process import AgentProcess, AgentStartError
from callcenter.lab.softphone import Softphone, caller_audio
from callcenter.store.calls import CallRecords
from callcenter.store.db import open_database
from tests.conftest import CONTROL_TOKEN, FLOW, free_tcp_port, free_udp_port, rtp_base, wait_for

pytestmark = [pytest.mark.sip, pytest.mark.slow, pytest.mark.no_deadline]  # rows, not audio on a deadline: the offline shard
if not shutil.which("baresip"):
    pytest.skip("baresip is needed (scripts/setup installs it)", allow_module_level=True)


def row_of(url: str, call_id: str) -> dict | None:
    db = open_database(url)
    try:
        return CallRecords(db, "", "").get(call_id)
    finally:
        db.close()


def api(agent: AgentProcess, path: str) -> dict:
    req = urllib.request.Request(agent.control_url + path, headers={"Authorization": f"Bearer {CONTROL_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def live_call_id(agent: AgentProcess) -> str:
    assert wait_for(lambda: agent.calls(), 15)
    return agent.calls()[0].stem


class ConsoleTap(threading.Thread):
    """What a console connected to the control API is sent: the contact center's own events."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.events = url, []

    def run(self) -> None:
        import aiohttp

        async def follow():
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}) as http:
                async with http.ws_connect(self.url + "/api/events") as ws:
                    async for msg in ws:
                        data = msg.json()
                        if data.get("type") == "event" and "call_id" not in data["event"]:
                            self.events.append(data["event"])
        try:
            asyncio.run(follow())
        except Exception as exc:
            self.events.append({"kind": "tap_failed", "error": repr(exc)})  # the agent stopped


def test_a_call_survives_a_database_restart_and_its_row_is_written_when_it_returns(tmp_path, postgres_server):
    url = postgres_server.new_database()
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                         token=CONTROL_TOKEN, extra_config=f"store: '{url}'\n").start()
    console = ConsoleTap(agent.control_url)
    console.start()
    try:
        mic = caller_audio([], tmp_path / "mic.wav", lead_s=30, gap_s=0, tail_s=0)
        with Softphone(tmp_path / "caller", mic, user="4930123456") as phone:
            phone.dial(agent.uri)
            assert phone.wait_established(10), phone.log()
            call_id = live_call_id(agent)
            assert wait_for(lambda: row_of(url, call_id) is not None, 10)
            postgres_server.stop()
            try:
                time.sleep(2)
                phone.hangup()  # the call ends while the database is down
                assert wait_for(lambda: '"call_ended"' in agent.log(), 10)
                assert wait_for(lambda: '"store_unavailable"' in agent.log(), 10), agent.log()[-2000:]
            finally:
                postgres_server.start()
        assert wait_for(lambda: (row_of(url, call_id) or {}).get("outcome") == "caller_hung_up", 20), \
            row_of(url, call_id)
        row = row_of(url, call_id)
        assert row["caller_number"] == "4930123456" and row["flow"] and row["recording"].endswith(".wav")
        assert row["ended"] >= row["started"] and row["events"].endswith(".jsonl")
        assert '"store_available_again"' in agent.log()
        # the console was told both: the store went away (with the writes waiting), and came back
        assert wait_for(lambda: [e["state"] for e in console.events if e["kind"] == "store"] ==
                        ["unavailable", "available"], 10), console.events
        assert "***" not in json.dumps(console.events) and "postgresql://" in console.events[0]["store"]
    finally:
        agent.stop()


def test_calls_list_shows_a_live_call_and_a_finished_one(tmp_path):
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                         token=CONTROL_TOKEN).start()  # the embedded store
    try:
        mic = caller_audio([], tmp_path / "mic.wav", lead_s=20, gap_s=0, tail_s=0)
        with Softphone(tmp_path / "caller", mic, user="4155550100") as phone:
            phone.dial(agent.uri)
            assert phone.wait_established(10), phone.log()
            call_id = live_call_id(agent)
            listed = subprocess.run([sys.executable, "-m", "callcenter.cli", "calls", "list", "--config",
                                     str(agent.config), "--json", str(tmp_path / "live.json")],
                                    capture_output=True, text=True, timeout=60)
            assert listed.returncode == 0 and "in progress" in listed.stdout, listed.stdout + listed.stderr
            phone.hangup()
            assert wait_for(lambda: '"call_ended"' in agent.log(), 10)
        db_url = f"sqlite:///{agent.config.parent / 'callcenter.db'}"
        assert wait_for(lambda: (row_of(db_url, call_id) or {}).get("outcome") == "caller_hung_up", 10)
        calls = json.loads((tmp_path / "live.json").read_text())["calls"]
        assert [c["call_id"] for c in calls] == [call_id] and calls[0]["caller_number"] == "4155550100"
        history = api(agent, "/api/calls/history?since=1h")["calls"]  # the control API, from the store
        assert [(c["call_id"], c["outcome"]) for c in history] == [(call_id, "caller_hung_up")]
        with pytest.raises(urllib.error.HTTPError) as bad:
            api(agent, "/api/calls/history?since=last+tuesday")
        assert bad.value.code == 400
    finally:
        agent.stop()


def test_a_store_unreachable_at_start_is_one_line_naming_it(tmp_path):
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW,
                         extra_config=f"store: postgresql://cc@127.0.0.1:{free_tcp_port()}/center\n")
    with pytest.raises(AgentStartError):
        agent.start(timeout=120)
    last = [line for line in agent.log().splitlines() if line.strip()][-1]
    assert last.startswith("callcenter: store postgresql://cc@127.0.0.1:") and "unreachable" in last, last


def test_the_console_finds_every_worker_of_the_fleet_in_the_store(tmp_path, postgres_server):
    """Two workers (think two hosts: no shared folder, one PostgreSQL store) register with their
    control APIs; `tui --config` finds both from the store alone, and a stopped one drops out."""
    from callcenter.store.workers import live_workers
    from callcenter.telephony.config import load_server_config
    from callcenter.workers import fleet_control_urls

    url = postgres_server.new_database()
    agents = [AgentProcess(tmp_path / f"host{i}", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                           token=CONTROL_TOKEN, extra_config=f"store: '{url}'\n").start() for i in range(2)]
    try:
        config = load_server_config(agents[0].config)
        assert wait_for(lambda: sorted(fleet_control_urls(config)) == sorted(a.control_url for a in agents), 10)
        db = open_database(url)
        rows = live_workers(db)
        assert {r.worker for r in rows} == {f"127.0.0.1:{a.sip_port}" for a in agents} and all(r.host for r in rows)
        agents[1].stop()
        assert wait_for(lambda: fleet_control_urls(config) == [agents[0].control_url], 10)
    finally:
        for a in agents:
            a.stop()
