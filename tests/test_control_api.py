"""The supervisor's control and event API on a running agent server (`callcenter serve` with
`control:`), driven over HTTP and WebSocket while a real baresip caller is on the line."""

import asyncio
import re
import shutil

import aiohttp
import pytest

from callcenter.audio.wavfile import read_wav
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.softphone import Softphone, caller_audio
from tests.conftest import FLOW, free_udp_port, rtp_base

pytestmark = [pytest.mark.sip, pytest.mark.slow]

if not shutil.which("baresip"):
    pytest.skip("baresip is not installed (scripts/setup installs it)", allow_module_level=True)

TOKEN = "test-token-5e2"
TYPED = "This is your supervisor speaking. I will look after your call personally."


def free_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def agent(tmp_path):
    proc = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                        token=TOKEN).start()
    yield proc
    proc.stop()


def test_every_request_needs_the_token(agent):
    async def main():
        async with aiohttp.ClientSession() as http:
            for headers, params in (({}, {}), ({"Authorization": "Bearer wrong"}, {}), ({}, {"token": "nope"})):
                async with http.get(agent.control_url + "/api/calls", headers=headers, params=params) as r:
                    assert r.status == 401 and (await r.json())["error"] == "missing or wrong token"
            async with http.post(agent.control_url + "/api/calls/x/hangup") as r:
                assert r.status == 401
            with pytest.raises(aiohttp.WSServerHandshakeError):
                await http.ws_connect(agent.control_url + "/api/events")
            # the token in a query string (which ends up in proxies' logs) only opens the WebSocket
            async with http.get(agent.control_url + "/api/calls", params={"token": TOKEN}) as r:
                assert r.status == 401
            ws = await http.ws_connect(agent.control_url + "/api/events", params={"token": TOKEN})
            assert (await ws.receive_json())["type"] == "hello"
            await ws.close()
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with http.get(agent.control_url + "/api/calls", headers=auth) as r:
                assert r.status == 200 and (await r.json()) == {"calls": []}
            async with http.get(agent.control_url + "/api/flows", headers=auth) as r:
                flows = (await r.json())["flows"]
                assert flows[0]["name"] == "support" and flows[0]["errors"] == []
            async with http.post(agent.control_url + "/api/calls/nope/hangup", headers=auth) as r:
                assert r.status == 404
            async with http.get(agent.control_url + "/api/recordings/..%2F..%2Fetc/passwd", headers=auth) as r:
                assert r.status in (400, 404)

    asyncio.run(main())
    assert TOKEN not in agent.log()


def test_take_over_is_heard_by_a_real_sip_caller(agent, tmp_path, stt):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    api = agent.control_url

    async def main():
        mic = caller_audio([], tmp_path / "mic.wav", lead_s=40, gap_s=0, tail_s=0)
        phone = Softphone(tmp_path / "phone", mic)
        await asyncio.to_thread(phone.dial, agent.uri)
        assert await asyncio.to_thread(phone.wait_established, 10), phone.log()
        events: list[dict] = []
        tables: list[list] = []
        async with aiohttp.ClientSession(headers=auth) as http:
            ws = await http.ws_connect(api + "/api/events")
            hello = await ws.receive_json(timeout=5)
            assert hello["type"] == "hello"

            async def listen():
                async for msg in ws:
                    data = msg.json()
                    if data["type"] == "event":
                        events.append(data["event"])
                    elif data["type"] == "calls":
                        tables.append(data["calls"])

            listener = asyncio.create_task(listen())
            for _ in range(50):
                async with http.get(api + "/api/calls") as r:
                    calls = (await r.json())["calls"]
                if calls:
                    break
                await asyncio.sleep(0.1)
            (call,) = calls
            assert call["flow"] == "support" and call["caller"].startswith("sip:caller@127.0.0.1")
            call_id = call["call_id"]
            await asyncio.sleep(2.0)  # the agent is greeting
            async with http.post(f"{api}/api/calls/{call_id}/say", json={"text": TYPED, "take_over": True}) as r:
                assert r.status == 200 and (await r.json())["call"]["state"] == "taken over"
            for bad, body in (("say", {"text": ""}), ("transfer", {"to": "not a uri"}), ("fly", {})):
                async with http.post(f"{api}/api/calls/{call_id}/{bad}", json=body) as r:
                    assert r.status in (400, 404)
            async with http.post(f"{api}/api/calls/{call_id}/mark", data="{not json",
                                 headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400
            await asyncio.sleep(12.0)  # longer than the node's 8 s no-input timeout: held, no reprompt
            async with http.post(f"{api}/api/calls/{call_id}/mark", json={"note": "check the greeting"}) as r:
                assert r.status == 200
            async with http.post(f"{api}/api/calls/{call_id}/release") as r:
                assert (await r.json())["call"]["state"] != "taken over"
            async with http.post(f"{api}/api/calls/{call_id}/hangup") as r:
                assert r.status == 200
            assert await asyncio.to_thread(phone.wait_ended, 15), phone.log()
            await asyncio.sleep(1.5)
            listener.cancel()
            async with http.get(api + "/api/recordings") as r:
                (rec,) = (await r.json())["recordings"]
            async with http.get(f"{api}/api/recordings/{rec['day']}/{rec['name']}") as r:
                stored = (await r.json())["events"]
            async with http.get(f"{api}/api/recordings/{rec['day']}/{rec['wav']}") as r:
                wav_bytes = await r.read()
        await asyncio.to_thread(phone.close)
        return events, tables, rec, stored, wav_bytes, read_wav(phone.received_wav())

    events, tables, rec, stored, wav_bytes, heard = asyncio.run(main())
    kinds = [e["kind"] for e in events]
    assert "call_start" in kinds or any(e["kind"] == "agent_say" for e in events)
    sup = [e for e in events if e["kind"] == "supervisor"]
    assert [e["action"] for e in sup][:2] == ["take_over", "say"]
    said_at = next(e["t"] for e in sup if e["action"] == "say")
    released_at = next(e["t"] for e in sup if e["action"] == "release")
    # held: nothing decided by the flow between take over and release (no no-input reprompt)
    assert not [e for e in events if e["kind"] == "flow_decision" and said_at < e["t"] < released_at]
    words = set(re.findall(r"[a-z]+", stt.transcribe_pcm(heard[int(said_at * 8000) * 2:
                                                             int((said_at + 6) * 8000) * 2]).text.lower()))
    assert len(words & {"supervisor", "speaking", "look", "after", "call", "personally"}) >= 3, words
    assert any(row and row[0]["state"] == "taken over" and "caller_db" in row[0]["levels"] for row in tables)
    assert rec["marked"] == "check the greeting" and rec["complete"] and rec["ended_by"] == "agent"
    assert rec["outcome"] == "ai_completed" and rec["caller"] and rec["direction"] == "inbound"  # from the store
    assert stored[-1]["kind"] == "call_end" and wav_bytes[:4] == b"RIFF"
    # a supervisor's hang-up is never a line gone dead: the caller hears a goodbye first
    hung = next(e["t"] for e in stored if e["kind"] == "supervisor" and e["action"] == "hangup")
    assert any(e["kind"] == "agent_say" and "Goodbye" in e["text"] and e["t"] >= hung for e in stored)
