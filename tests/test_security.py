"""The agent attacked as an outsider would, on loopback: each hole found once is attacked again here,
against the real component (Kamailio with the config `callcenter kamailio-config` writes, the agent's
SIP stack, the control API, the browser gateway, the flow engine and its webhook client), and must be
refused. All traffic stays on 127.0.0.0/8."""

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from callcenter.audio.wavfile import read_wav
from callcenter.call.events import read_events
from callcenter.lab.balancer import KamailioProcess
from tests.conftest import ROOT, free_tcp_port, free_udp_port, rtp_base, wait_for
from tests.sipraw import RawUac, request, status_of

pytestmark = [pytest.mark.slow]
AUTH_UAC = ROOT / "tests" / "sipp" / "uac_auth.xml"
PAYMENT_FLOW = ROOT / "tests" / "flows" / "payment.yaml"
CARD = "4111111111111111"  # a test card number that passes the Luhn check
SPOKEN_CARD = "4242424242424242"
needs_sip = pytest.mark.skipif(not shutil.which("sipp") or not shutil.which("kamailio") or
                               not shutil.which("baresip"), reason="sipp, kamailio and baresip are needed")


def card_leaks(text: str, card: str) -> bool:
    """Does `text` hold the card number beyond its last four, in any spelling: 4111111111111111,
    4111 1111 ..., 4-1-1-1..., or spoken as number words?"""
    if re.search(r"[\s.,\-/]*".join(card[:8]), text):
        return True
    words = "zero one two three four five six seven eight nine".split()
    spoken = r"\W+".join(words[int(d)] for d in card[:6])
    return re.search(spoken, text, re.IGNORECASE) is not None


def drain(sock: socket.socket, seconds: float) -> list[bytes]:
    """Every datagram `sock` receives within `seconds`."""
    heard, deadline = [], time.monotonic() + seconds
    sock.settimeout(0.1)
    while time.monotonic() < deadline:
        try:
            heard.append(sock.recvfrom(65535)[0])
        except socket.timeout:
            pass
    return heard


# ------------------------------------------------------------------ Kamailio
@pytest.fixture(scope="module")
def balancer(tmp_path_factory):
    """A worker behind a Kamailio that authenticates callers (alice only)."""
    from callcenter.lab.agent_process import AgentProcess

    d = tmp_path_factory.mktemp("kam")
    agent = AgentProcess(d / "agent", free_udp_port(), rtp_base(), ROOT / "flows" / "support.yaml").start()
    port = free_udp_port()
    env = dict(os.environ, ALICE_PASSWORD="correct horse")
    subprocess.run([sys.executable, "-m", "callcenter.cli", "kamailio-config", "--worker",
                    agent.uri.replace("agent@", ""), "--listen", f"127.0.0.1:{port}", "--out", str(d / "cfg"),
                    "--caller", "alice=ALICE_PASSWORD", "--rate-limit", "30"], check=True, capture_output=True,
                   env=env)
    log = d / "kamailio.log"
    kam = KamailioProcess(d / "cfg" / "kamailio.cfg", log, d / "k.pid")
    kam.wait_ready("127.0.0.1", port)
    yield {"port": port, "agent": agent, "log": log, "dir": d}
    kam.stop()
    agent.stop()


def sipp_auth(balancer, user: str, password: str, tag: str) -> str:
    d = balancer["dir"]
    subprocess.run(["sipp", "-sf", str(AUTH_UAC), f"127.0.0.1:{balancer['port']}", "-s", "agent", "-i", "127.0.0.1",
                    "-p", "0", "-au", user, "-ap", password, "-m", "1", "-d", "1000", "-timeout", "20",
                    "-nostdin", "-trace_msg", "-message_file", str(d / f"{tag}.msg")],
                   cwd=d, capture_output=True, timeout=40)
    return (d / f"{tag}.msg").read_text(errors="replace")


@needs_sip
@pytest.mark.sip
@pytest.mark.no_deadline  # signalling only
def test_unknown_user_with_password_0_is_forbidden(balancer):
    """`$sht(callers=>eve)` is $null, which a $var stores as 0: the password "0" passed once."""
    for user, password in (("eve", "0"), ("eve", ""), ("mallory", "correct horse")):
        trace = sipp_auth(balancer, user, password or "x", f"unknown-{user}")
        assert "SIP/2.0 403 Forbidden" in trace and "SIP/2.0 200" not in trace, trace[-1500:]
    assert balancer["agent"].calls() == []
    assert "unknown user 'eve'" in balancer["log"].read_text()
    right = sipp_auth(balancer, "alice", "correct horse", "alice")
    assert "SIP/2.0 200 OK" in right, right[-1500:]
    assert wait_for(lambda: len(balancer["agent"].calls()) == 1, 10)


@needs_sip
@pytest.mark.sip
@pytest.mark.no_deadline  # signalling only
def test_forged_in_dialog_requests_are_not_relayed(balancer):
    """A made-up To-tag and a Route naming Kamailio once took INVITE and MESSAGE anywhere (toll
    fraud). Now they reach nothing: the socket they were aimed at hears nothing."""
    target = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    target.bind(("127.0.0.1", 0))
    target.settimeout(0.2)
    victim = f"sip:+19005550100@127.0.0.1:{target.getsockname()[1]}"
    uac = RawUac()
    kam = ("127.0.0.1", balancer["port"])
    codes = []
    try:
        for method, body in (("MESSAGE", "free calls"), ("INVITE", ""), ("BYE", "")):
            call_id = f"forged-{method}@127.0.0.1"
            msg = request(method, victim, uac.local, call_id, "f1", 1, to_tag="made-up",
                          extra=f"Route: <sip:127.0.0.1:{balancer['port']};lr>", body=body)
            uac.send(msg, kam)
            response = uac.final(call_id, 3.0)
            codes.append(status_of(response) if response else None)
        heard = drain(target, 2.0)
    finally:
        target.close()
        uac.close()
    assert heard == [], heard[:1]
    assert codes == [403, 403, 403], codes
    assert "matches no dialog of ours" in balancer["log"].read_text()


@needs_sip
@pytest.mark.sip
@pytest.mark.no_deadline  # signalling only
def test_a_flood_from_one_address_is_cut_off(balancer):
    """pike: more than --rate-limit requests in 2 s from one address (not a worker) are dropped.
    From 127.0.0.2, so the other tests' 127.0.0.1 is not blocked."""
    uac = RawUac("127.0.0.2")
    kam = ("127.0.0.1", balancer["port"])
    answered = 0
    try:
        for i in range(200):
            uac.send(request("OPTIONS", f"sip:127.0.0.1:{balancer['port']}", uac.local, f"flood-{i}", "o", 1), kam)
        deadline = time.monotonic() + 3.0
        uac.sock.settimeout(0.3)
        while time.monotonic() < deadline:
            try:
                data, _ = uac.sock.recvfrom(65535)
                answered += status_of(data) == 200
            except socket.timeout:
                pass
    finally:
        uac.close()
    assert answered < 120, answered  # pike blocks between 30 and 90 requests
    assert "rate limit" in balancer["log"].read_text()


# ------------------------------------------------------------------ card numbers (PCI DSS)
TOKEN = "security-token-7f1"


def noisy_mic(path: Path, seconds: float, speech: Path | None = None, at_s: float = 0.0) -> Path:
    """A caller's microphone: steady low noise (so the recording shows whether the caller's side was
    kept), with `speech` mixed in at `at_s`."""
    from callcenter.audio.frames import float_to_pcm, pcm_to_float
    from callcenter.audio.wavfile import write_wav

    rng = np.random.default_rng(7)
    x = rng.normal(0, 10 ** (-38 / 20), int(seconds * 8000))
    if speech is not None:
        s = pcm_to_float(read_wav(speech))
        i = int(at_s * 8000)
        x[i:i + len(s)] += s[: len(x) - i]
    write_wav(path, float_to_pcm(x))
    return path


def stereo(wav: Path) -> tuple[np.ndarray, np.ndarray]:
    import wave

    with wave.open(str(wav)) as w:
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    return x[:, 0], x[:, 1]


class EventTap:
    """A console's WebSocket on the control API, in a thread: every message it is sent."""

    def __init__(self, url: str):
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(url)), daemon=True)
        self._thread.start()

    async def _run(self, url: str) -> None:
        import aiohttp

        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            async with http.ws_connect(url + "/api/events") as ws:
                while not self._stop.is_set():
                    try:
                        msg = await ws.receive(timeout=0.2)
                    except asyncio.TimeoutError:
                        continue
                    if msg.type != 1:  # TEXT
                        break
                    self.messages.append(msg.data)

    def close(self) -> str:
        self._stop.set()
        self._thread.join(5)
        return "\n".join(self.messages)


@pytest.fixture(scope="module")
def pay_agent(tmp_path_factory):
    from callcenter.lab.agent_process import AgentProcess

    d = tmp_path_factory.mktemp("pay")
    recordings = d / "recordings"
    old = recordings / "2020-01-01"
    old.mkdir(parents=True)
    (old / "old-call.wav").write_bytes(b"RIFF")
    os.utime(old / "old-call.wav", (time.time() - 40 * 86400,) * 2)
    (recordings / "2020-01-02").mkdir()
    (recordings / "2020-01-02" / "recent.jsonl").write_text("{}\n")  # recent by mtime: kept
    agent = AgentProcess(d / "agent", free_udp_port(), rtp_base(), PAYMENT_FLOW, recordings=recordings,
                         control_port=free_tcp_port(), token=TOKEN, extra_config="retention_days: 30\n").start()
    yield agent
    agent.stop()


@pytest.mark.sip
@pytest.mark.skipif(not shutil.which("baresip") or not shutil.which("flite"), reason="baresip and flite needed")
def test_card_numbers_keyed_or_spoken_appear_nowhere(pay_agent, tmp_path, caller_voice):
    from callcenter.lab.softphone import Softphone

    agent = pay_agent
    tap = EventTap(agent.control_url)
    time.sleep(0.5)
    # 1. keyed on the phone's keypad (RFC 4733), while the line carries steady noise
    with Softphone(tmp_path / "keyed", noisy_mic(tmp_path / "keyed.wav", 60)) as phone:
        phone.dial(agent.uri)
        assert phone.wait_established(10), phone.log()
        time.sleep(3.5)
        for digit in CARD:
            phone.press(digit)
            time.sleep(0.25)
        assert phone.wait_ended(40), phone.log()
    # 2. said aloud
    spoken = caller_voice("card", "four two four two, four two four two, four two four two, four two four two.")
    with Softphone(tmp_path / "spoken", noisy_mic(tmp_path / "spoken.wav", 60, spoken, 4.0)) as phone:
        phone.dial(agent.uri)
        assert phone.wait_established(10), phone.log()
        # recognised, the call ends by itself in ~22 s; on a busy machine Whisper may miss a digit
        # in the noise, and the node asks again (20 s a try): the caller then hangs up
        if not phone.wait_ended(35):
            phone.hangup()
            assert phone.wait_ended(10), phone.log()
    time.sleep(1.0)
    ws_text = tap.close()

    calls = [p for p in agent.calls() if "sip-" in p.name]
    assert len(calls) == 2, calls
    keyed, said = (read_events(p) for p in sorted(calls, key=lambda p: read_events(p)[0]["wall"]))
    stored = "\n".join(p.read_text() for p in calls)
    for card in (CARD, SPOKEN_CARD):
        assert not card_leaks(stored, card), card
        assert not card_leaks(ws_text, card), card
        assert not card_leaks(agent.log(), card), card
    assert '"kind": "agent_say"' in ws_text  # the console did see the calls
    # the keyed number: captured, shown masked, no digit logged one by one
    decision = next(e for e in keyed if e["kind"] == "flow_decision" and e.get("value"))
    assert decision["value"] == "************1111" and decision["via"] == "keypad"
    assert [e for e in keyed if e["kind"] == "dtmf"] == []
    said_texts = [e["text"] for e in keyed if e["kind"] == "agent_say"]
    assert "To confirm, the number is ************1111." in said_texts, said_texts
    assert any("ending in 1 1 1 1" in t for t in said_texts)
    # the recording: the caller's side silent while the digits were keyed, the line's noise before
    # the card was asked for... and after it was taken
    wav = sorted(calls, key=lambda p: read_events(p)[0]["wall"])[0].with_suffix(".wav")
    left, right = stereo(wav)
    taken = decision["t"]
    window = left[int((taken - 3.0) * 8000): int(taken * 8000)]
    assert window.size > 0 and np.abs(window).max() == 0
    after = left[int((taken + 2.0) * 8000):]
    assert after.size > 8000 and np.abs(after).max() > 0
    # the full read-back reached the caller but not the recording: the agent's side is silent then
    readback = next(e for e in keyed if e["kind"] == "agent_say" and e["text"].startswith("To confirm"))
    first = next(e["t"] for e in keyed if e["kind"] == "first_rtp_out" and e["utterance"] == readback["utterance"])
    done = next(e["t"] for e in keyed if e["kind"] == "playout_done" and e["utterance"] == readback["utterance"])
    assert done - first > 2.0
    assert np.abs(right[int((first + 0.1) * 8000): int((done - 0.1) * 8000)]).max() == 0
    # the spoken number: the caller's words masked in the transcript
    finals = [e["text"] for e in said if e["kind"] in ("stt_final", "stt_partial")]
    assert finals and not any(re.search(r"\d", t) for t in finals), finals
    spoken_decision = [e for e in said if e["kind"] == "flow_decision" and e.get("value")]
    if spoken_decision:  # recognised in full (Whisper on flite): masked as the keyed one
        assert spoken_decision[0]["value"] == "************4242"
    # files private to the agent's user
    for p in calls:
        assert oct(p.stat().st_mode & 0o777) == "0o600" and oct(p.with_suffix(".wav").stat().st_mode & 0o777) == "0o600"
        assert oct(p.parent.stat().st_mode & 0o777) == "0o700"
    assert oct(agent.recordings.stat().st_mode & 0o777) == "0o700"


def test_old_recordings_are_deleted_at_start(pay_agent):
    recordings = pay_agent.recordings
    assert not (recordings / "2020-01-01").exists()  # 40 days old, retention 30 days
    assert (recordings / "2020-01-02" / "recent.jsonl").exists()
    assert '"recordings_purged"' in pay_agent.log()


# ------------------------------------------------------------------ calls' names and call slots
def call_files(agent) -> dict[str, Path]:
    """sip_call_id → the call's JSONL, for every call the agent recorded."""
    out = {}
    for jsonl in agent.recordings.glob("*/*.jsonl"):
        events = read_events(jsonl)
        if events and "sip_call_id" in events[0]:
            out[events[0]["sip_call_id"]] = jsonl
    return out


@pytest.mark.sip
def test_call_ids_never_name_files_and_a_live_call_id_is_refused(pay_agent):
    agent = ("127.0.0.1", pay_agent.sip_port)
    uac = RawUac()
    dialogs = []
    try:
        for call_id in ("other@10.0.0.1", "other@10.0.0.2", "."):
            code, _, dialog = uac.invite(agent, call_id)
            assert code == 200, (call_id, code)
            uac.ack(agent, dialog)
            dialogs.append(dialog)
        code, response, _ = uac.invite(agent, "other@10.0.0.1", from_tag="second")  # a live Call-ID again
        assert code == 482, response
        assert wait_for(lambda: {"other@10.0.0.1", "other@10.0.0.2", "."} <= set(call_files(pay_agent)), 5)
        files = call_files(pay_agent)
        named = [files[c] for c in ("other@10.0.0.1", "other@10.0.0.2", ".")]
        assert len(set(named)) == 3 and all(p.parent.parent == pay_agent.recordings for p in named), named
        assert all(p.stem.startswith("sip-") and p.with_suffix(".wav").exists() for p in named)
        for dialog in dialogs:
            assert uac.bye(agent, dialog) == 200
    finally:
        uac.close()
    assert '"reason": "call_id_in_use"' in pay_agent.log()


@pytest.mark.sip
def test_invites_never_acked_free_their_call_slots(pay_agent):
    """Four INVITEs never ACKed held all four call slots for 64 s. Now each is hung up after
    ANSWER_TIMEOUT_S, and leaves no recording behind."""
    from callcenter.server import ANSWER_TIMEOUT_S

    agent = ("127.0.0.1", pay_agent.sip_port)
    assert wait_for(lambda: '"live_calls"' not in pay_agent.log() or True, 1)
    time.sleep(2.0)  # the calls of the tests before have ended
    holders = [RawUac() for _ in range(4)]
    uac = RawUac()
    try:
        held = [h.invite(agent)[2]["call_id"] for h in holders]
        code, _, _ = uac.invite(agent)
        assert code == 486  # every slot taken, for now
        time.sleep(ANSWER_TIMEOUT_S + 2.0)
        code, response, dialog = uac.invite(agent)
        assert code == 200, response
        uac.ack(agent, dialog)
        assert wait_for(lambda: dialog["call_id"] in call_files(pay_agent), 5)
        assert uac.bye(agent, dialog) == 200
    finally:
        for u in holders + [uac]:
            u.close()
    assert pay_agent.log().count('"sip_call_not_acked"') >= 4
    assert not set(held) & set(call_files(pay_agent))  # no media ever flowed: nothing recorded


# ------------------------------------------------------------------ control API
@pytest.mark.sip
def test_control_api_serves_only_plain_files_and_refuses_bad_bodies_and_origins(pay_agent):
    import aiohttp
    import yarl

    rec = pay_agent.recordings
    secret = rec.parent / "secret.wav"
    secret.write_text("top secret")
    day = sorted(p for p in rec.iterdir() if p.is_dir() and not p.is_symlink())[-1]
    (day / "passwd.wav").symlink_to("/etc/passwd")
    (rec / "2020-02-02").symlink_to(rec.parent)
    url = pay_agent.control_url
    auth = {"Authorization": f"Bearer {TOKEN}"}
    agent = ("127.0.0.1", pay_agent.sip_port)
    uac = RawUac()
    _, _, dialog = uac.invite(agent)
    uac.ack(agent, dialog)

    async def main():
        out = {}
        async with aiohttp.ClientSession(headers=auth) as http:
            for path in ("/api/recordings/../secret.wav", "/api/recordings/%2E%2E/secret.wav",
                         "/api/recordings/.%2E/secret.wav", "/api/recordings/..%2Fsecret.wav/x",
                         f"/api/recordings/{day.name}/passwd.wav", "/api/recordings/2020-02-02/secret.wav"):
                async with http.get(yarl.URL(url + path, encoded=True)) as r:
                    out[path] = (r.status, await r.read())
            for _ in range(50):
                async with http.get(url + "/api/calls") as r:
                    calls = (await r.json())["calls"]
                if calls and calls[0]["state"] != "ringing":
                    break
                await asyncio.sleep(0.1)
            cid = calls[0]["call_id"]
            async with http.post(f"{url}/api/calls/{cid}/mark", data="[" * 20000,
                                 headers={"Content-Type": "application/json"}) as r:
                out["deep"] = r.status
            async with http.post(f"{url}/api/calls/{cid}/mark", data='{"note": "bad \\ud800 text"}',
                                 headers={"Content-Type": "application/json"}) as r:
                out["surrogate"] = r.status
            try:
                await http.ws_connect(url + "/api/events", headers={"Origin": "http://evil.example"})
                out["origin"] = 101
            except aiohttp.WSServerHandshakeError as exc:
                out["origin"] = exc.status
        return out

    try:
        out = asyncio.run(main())
    finally:
        uac.bye(agent, dialog)
        uac.close()
    for path in [p for p in out if p.startswith("/")]:
        status, body = out[path]
        assert status in (400, 403, 404) and b"top secret" not in body and b"root:" not in body, (path, status)
    assert out["deep"] == 400 and out["surrogate"] == 200 and out["origin"] == 403
    files = call_files(pay_agent)
    marked = read_events(files[dialog["call_id"]])
    assert any(e["kind"] == "marked" and e["note"].startswith("bad ") for e in marked)
    assert pay_agent.proc.poll() is None


# ------------------------------------------------------------------ browser callers
async def dead_offer(url: str, source: str, candidate: tuple[str, int] | None = None) -> int:
    """An offer from `source` that will never connect (its peer never takes the answer), with
    `candidate` as its only ICE candidate if given: what an attacker holding slots sends."""
    import aiohttp
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="sendrecv")
    pc.createDataChannel("keypad")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    if candidate is not None:
        lines = [x for x in sdp.splitlines() if not x.startswith("a=candidate")]
        i = next(n for n, x in enumerate(lines) if x.startswith("m=audio"))
        lines.insert(i + 1, f"a=candidate:1 1 udp 2130706431 {candidate[0]} {candidate[1]} typ host")
        sdp = "\r\n".join(lines) + "\r\n"
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.post(url + "/call/offer", json={"sdp": sdp, "type": "offer"}) as r:
            return r.status


@pytest.mark.sip
def test_offers_that_never_connect_cannot_hold_slots_or_aim_stun(tmp_path):
    """From 127.0.0.2, offers that never connect (one of them naming 127.0.0.9 as its candidate)
    keep coming; a real caller from 127.0.0.1 still gets through every time, nothing is recorded
    for the dead offers, and no STUN reaches the address the attacker chose. Then one cap for all
    transports: two browser calls and the process's last slot on SIP, then 486."""
    from callcenter.lab.agent_process import AgentProcess
    from callcenter.lab.browser_caller import BrowserCaller

    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), ROOT / "flows" / "support.yaml",
                         webrtc_port=free_tcp_port(), webrtc_max_calls=2, max_calls=3).start()
    target = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    target.bind(("127.0.0.9", 0))
    target.settimeout(0.1)
    url = agent.webrtc_url

    async def main():
        statuses, connected = [], 0
        for _ in range(3):
            statuses.append(await dead_offer(url, "127.0.0.2", target.getsockname()))
            statuses.append(await dead_offer(url, "127.0.0.3"))
            caller = await BrowserCaller(url).call()
            connected += 1
            await asyncio.sleep(0.5)
            await caller.hangup()
            await asyncio.sleep(0.5)
        async with __import__("aiohttp").ClientSession() as http:
            async with http.post(url + "/call/offer", data="[" * 20000,
                                 headers={"Content-Type": "application/json"}) as r:
                deep = r.status
        return statuses, connected, deep

    try:
        statuses, connected, deep = asyncio.run(main())
        heard = drain(target, 2.0)
        assert connected == 3 and all(s == 200 for s in statuses), statuses
        assert heard == []  # the agent never sent STUN to the address an offer named
        assert deep == 400
        assert wait_for(lambda: len(agent.calls()) == 3, 10)  # the three real calls; no dead offer
        assert "webrtc_candidates_dropped" in agent.log() and "webrtc_offer_dropped" in agent.log()

        async def cap():  # max_calls 3: two browser calls take two slots, SIP the third, then no more
            callers = [await BrowserCaller(url).call() for _ in range(2)]
            uac = RawUac()
            sip = ("127.0.0.1", agent.sip_port)
            first, _, dialog = uac.invite(sip)
            uac.ack(sip, dialog)
            second, _, _ = uac.invite(sip)
            uac.bye(sip, dialog)
            uac.close()
            for c in callers:
                await c.hangup()
            return first, second

        assert asyncio.run(cap()) == (200, 486)
    finally:
        target.close()
        agent.stop()


# ------------------------------------------------------------------ webhooks and expressions
class Servers:
    """Two HTTP servers on loopback (two origins) in a thread: `a` answers the flow's webhooks,
    `b` is another host that must never see the flow's secrets. Each records what it is asked."""

    def __init__(self):
        from aiohttp import web

        self.seen: dict[str, list[dict]] = {"a": [], "b": []}
        self.ports = {"a": free_tcp_port(), "b": free_tcp_port()}
        self.loop = asyncio.new_event_loop()

        def app(name):
            async def any_path(request):
                self.seen[name].append({"path": request.raw_path, "headers": dict(request.headers)})
                p = request.path
                if p.startswith("/elsewhere"):
                    raise web.HTTPFound(f"http://127.0.0.1:{self.ports['b']}/steal")
                if p.startswith("/same"):
                    raise web.HTTPFound("/big")
                if p.startswith("/big"):  # about 200 KB, sent in many chunks
                    return web.json_response({"customer": {"name": "Dana"}, "pad": "x" * 200_000})
                return web.json_response({"customer": {"name": "Robin"}})

            a = web.Application()
            a.router.add_route("*", "/{tail:.*}", any_path)
            return a

        async def start():
            self.runners = []
            for name in ("a", "b"):
                runner = web.AppRunner(app(name))
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", self.ports[name]).start()
                self.runners.append(runner)

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def close(self):
        async def stop():
            for r in self.runners:
                await r.cleanup()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def servers():
    s = Servers()
    yield s
    s.close()


def fetch(url: str, headers=None):
    from callcenter.dialog.engine import Fetch
    from callcenter.dialog.services import FlowServices

    return asyncio.run(FlowServices(None).fetch(Fetch("n", "GET", url, headers or {}, None, 5.0)))


def test_webhook_redirects_stay_on_their_host_and_long_replies_are_read_whole(servers):
    away = fetch(servers.url("a") + "/elsewhere", {"X-Api-Key": "sk-secret"})
    assert away.data is None and "redirect to another host" in away.error
    assert servers.seen["b"] == []  # the secret header never left for the other host
    same = fetch(servers.url("a") + "/same")  # a redirect on the same host is followed
    assert same.error is None and same.data["customer"]["name"] == "Dana" and len(same.data["pad"]) == 200_000


def test_caller_values_cannot_choose_a_webhook_host_or_climb_its_path(servers, tmp_path):
    from callcenter.dialog.engine import Dialog
    from callcenter.dialog.flow import load_flow
    from callcenter.yamlfile import UserFileError

    bad = tmp_path / "host.yaml"
    bad.write_text("""name: host
start: ask
nodes:
  ask:
    type: ask
    prompt: Where shall I send it?
    on_failure: bye
    slots: {site: {type: text}}
    next: hook
  hook: {type: webhook, url: "{site}/api", next: bye, on_failure: bye}
  bye: {type: hangup, text: Bye.}
""")
    with pytest.raises(UserFileError) as err:
        load_flow(bad)
    assert "scheme or host" in str(err.value) and "host.yaml:10" in str(err.value)

    good = tmp_path / "path.yaml"
    good.write_text(bad.read_text().replace('url: "{site}/api"', 'url: "{base}/files/{site}"')
                    .replace("start: ask", f"start: ask\nvariables: {{base: \"{servers.url('a')}\"}}"))
    flow = load_flow(good)
    d = Dialog(flow, encoder=None)
    d.start()
    (fetch_action,) = [a for a in d.on_utterance("../../admin?x=1#y") if type(a).__name__ == "Fetch"]
    assert fetch_action.url == servers.url("a") + "/files/%2E%2E%2F%2E%2E%2Fadmin%3Fx%3D1%23y"
    result = fetch(fetch_action.url)
    assert result.error is None
    assert servers.seen["a"][-1]["path"] == "/files/%2E%2E%2F%2E%2E%2Fadmin%3Fx%3D1%23y"  # did not climb


@pytest.mark.slow
def test_webhook_secrets_are_redacted_from_events_and_logs(servers, tmp_path, stt, tts, monkeypatch):
    import structlog

    from callcenter.call.simulate import simulate_call
    from callcenter.dialog.flow import load_flow

    secret = "sk-live-9f8e7d6c5b4a"
    monkeypatch.setenv("CRM_KEY", secret)
    path = tmp_path / "crm.yaml"
    path.write_text(f"""name: crm
env: [CRM_KEY]
variables: {{crm: "{servers.url('a')}"}}
start: lookup
nodes:
  lookup:
    type: webhook
    url: "{{crm}}/elsewhere?key={{CRM_KEY}}"
    headers: {{X-Api-Key: "{{CRM_KEY}}"}}
    save: {{name: customer.name}}
    next: bye
    on_failure: sorry
  sorry: {{type: hangup, text: Sorry.}}
  bye: {{type: hangup, text: Goodbye.}}
""")
    with structlog.testing.capture_logs() as logs:
        result, events = asyncio.run(simulate_call(load_flow(path), [], tmp_path / "out", stt, tts))
    assert result.path == ["lookup", "sorry"]
    stored = (tmp_path / "out" / f"{events.call_id}.jsonl").read_text()
    assert secret not in stored and secret not in json.dumps(logs)
    assert "key=[redacted]" in stored
    assert any(entry.get("event") == "webhook_failed" and "[redacted]" in entry["url"] for entry in logs)
    assert servers.seen["a"][0]["headers"]["X-Api-Key"] == secret  # the webhook itself got it
    assert servers.seen["b"] == []


def test_expressions_that_overflow_or_nest_deeply_are_expression_errors():
    from callcenter.dialog.expr import ExprError, parse_expr

    big = parse_expr("9" * 400 + " * 1.5")
    with pytest.raises(ExprError):
        big.eval({})
    assert big.truth({}) is False
    for deep in ("not " * 1000 + "x", "- " * 1000 + "1", "x and (" * 100 + "x" + ")" * 100):
        with pytest.raises(ExprError):
            parse_expr(deep).eval({"x": 1})


@pytest.mark.sip
@pytest.mark.no_deadline  # signalling only
def test_options_and_message_from_outside_the_acl_are_forbidden(tmp_path):
    from callcenter.lab.agent_process import AgentProcess

    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), ROOT / "flows" / "support.yaml",
                         extra_config="acl: [127.0.0.1/32]\n").start()
    addr = ("127.0.0.1", agent.sip_port)
    answers = {}
    try:
        for source in ("127.0.0.2", "127.0.0.1"):
            uac = RawUac(source)
            for method, body in (("OPTIONS", ""), ("MESSAGE", "hello"), ("INVITE", None)):
                call_id = f"{method}-{source}"
                if method == "INVITE":
                    code = uac.invite(addr, call_id)[0] if source != "127.0.0.1" else None
                else:
                    uac.send(request(method, f"sip:agent@127.0.0.1:{agent.sip_port}", uac.local, call_id, "t", 1,
                                     body=body), addr)
                    response = uac.final(call_id, 3.0)
                    code = status_of(response) if response else None
                answers[(source, method)] = code
            uac.close()
    finally:
        agent.stop()
    assert answers[("127.0.0.2", "OPTIONS")] == 403 and answers[("127.0.0.2", "MESSAGE")] == 403
    assert answers[("127.0.0.2", "INVITE")] == 403
    assert answers[("127.0.0.1", "OPTIONS")] == 200  # inside the ACL, as before
    assert '"sip_request_rejected"' in agent.log() and "acl_filter_disabled" not in agent.log()


def test_the_console_takes_its_token_from_a_file_never_the_command_line(tmp_path):
    def cc(*args):
        return subprocess.run([sys.executable, "-m", "callcenter.cli", *map(str, args)], capture_output=True,
                              text=True, timeout=60)

    r = cc("tui", "--token", "s3cret")
    assert r.returncode != 0 and "--token-file" in r.stderr and "s3cret" not in r.stderr
    r = cc("tui", "--token-file", tmp_path / "missing")
    assert r.returncode != 0 and "cannot read the token file" in (r.stdout + r.stderr)
    assert "Traceback" not in r.stderr


def test_a_control_api_off_loopback_warns_loudly(tmp_path):
    import structlog

    from callcenter.supervisor.api import ControlApi
    from callcenter.telephony.config import Control

    async def main():
        api = ControlApi(None, Control(host="0.0.0.0", port=0), tmp_path, "t")
        await api.start()
        await api.stop()

    with structlog.testing.capture_logs() as logs:
        asyncio.run(main())
    assert any(e["event"] == "control_not_loopback" and "TLS" in e["warning"] for e in logs)


def test_webhooks_get_the_card_number_the_events_do_not(tmp_path):
    """The flow can still send a sensitive value to its payment webhook; only the stored and sent
    copies are masked."""
    from callcenter.call.events import CallEvents
    from callcenter.dialog.engine import Dialog, Fetch
    from callcenter.dialog.flow import load_flow

    flow = tmp_path / "pay.yaml"
    flow.write_text(PAYMENT_FLOW.read_text().replace(
        "    next: thanks\n", "    next: charge\n  charge:\n    type: webhook\n    method: POST\n"
        "    url: \"{api}/charge?card={card}\"\n    body: {card: \"{card}\"}\n    next: thanks\n"
        "    on_failure: bye\n", 1).replace("start: card", "start: card\nvariables: {api: \"http://127.0.0.1:9\"}"))
    d = Dialog(load_flow(flow), encoder=None)
    events = CallEvents("c1", tmp_path / "c1.jsonl")
    events.scrub = d.redactor.scrub
    d.start()
    actions = d.on_utterance("4111 1111 1111 1111")
    (hook,) = [a for a in actions if isinstance(a, Fetch)]
    assert hook.body == {"card": CARD} and hook.url.endswith(f"card={CARD}")
    events.emit("webhook", url=hook.url, body=hook.body, value=d.last_decision.value)
    events.close()
    stored = (tmp_path / "c1.jsonl").read_text()
    assert CARD not in stored and stored.count("************1111") == 3
