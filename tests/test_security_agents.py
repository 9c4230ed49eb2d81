"""Nobody poses as a human agent, and the balancer relays nothing it did not set up: the attacks of the
second security review, against the real Kamailio config `kamailio-config --caller --agent` writes and
a real worker with a contact center, from raw UDP (what no softphone would send). All on 127.0.0.0/8.

- a caller (carol, with a caller's credentials only) sends INVITE sip:agent@balancer with the keypad
  code in To and `X-Callcenter-Agent: bob` plain, folded onto another header's line with a space or a
  tab, or in lower case: Kamailio refuses each, and bob's state never changes;
- the same INVITEs straight to the worker, with no credentials: the worker takes an agent's name from
  its trusted proxies only, so each is an ordinary call;
- a real agent's authenticated `*45` still pauses them, and a captured one cannot be replayed;
- REGISTER: one contact, at the sender's own address;
- in-dialog requests with a Route of the caller's beyond Kamailio's own are refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

from callcenter.lab.balancer import KamailioProcess
from tests.conftest import ROOT, free_udp_port, rtp_base, wait_for
from tests.sipraw import SDP, RawUac, header, request, status_of

pytestmark = [pytest.mark.sip, pytest.mark.slow]
if not shutil.which("kamailio"):
    pytest.skip("kamailio is needed (scripts/setup installs it)", allow_module_level=True)

PASSWORDS = {"carol": "carol-caller-pw", "alice": "alice-agent-pw", "bob": "bob-agent-pw"}
AGENT_FORMS = {  # the agent header as an attacker writes it
    "plain": "X-Callcenter-Agent: bob",
    "folded": "Subject: hello\r\n X-Callcenter-Agent: bob",
    "tab-folded": "Subject: hello\r\n\tX-Callcenter-Agent: bob",
    "lower-case": "x-callcenter-agent: bob",
}


def digest(challenge: str, method: str, uri: str, user: str, password: str, nc: int = 1) -> str:
    """An Authorization / Proxy-Authorization value answering `challenge` (qop=auth when offered)."""
    p = dict(re.findall(r'(\w+)="?([^",]*)"?', challenge))
    md5 = lambda s: hashlib.md5(s.encode()).hexdigest()  # noqa: E731
    ha1, ha2 = md5(f"{user}:{p['realm']}:{password}"), md5(f"{method}:{uri}")
    value = f'Digest username="{user}", realm="{p["realm"]}", nonce="{p["nonce"]}", uri="{uri}"'
    if "qop" in p:
        cnonce = uuid.uuid4().hex[:8]
        response = md5(f"{ha1}:{p['nonce']}:{nc:08x}:{cnonce}:auth:{ha2}")
        return value + f', response="{response}", qop=auth, nc={nc:08x}, cnonce="{cnonce}", algorithm=MD5'
    response = md5(f"{ha1}:{p['nonce']}:{ha2}")
    return value + f', response="{response}", algorithm=MD5'


class Uac(RawUac):
    def responses(self, call_id: str, timeout: float = 5.0) -> bytes | None:
        return self.final(call_id, timeout)

    def invite(self, to: tuple[str, int], ruri: str, to_uri: str | None = None, extra: str = "",
               user: str | None = None, call_id: str | None = None) -> tuple[int | None, bytes | None, dict]:
        """INVITE `ruri` (To: `to_uri`), answering a 407 with `user`'s credentials when given."""
        call_id = call_id or f"{uuid.uuid4().hex}@{self.local[0]}"
        from_tag = uuid.uuid4().hex[:8]
        body = SDP.format(ip=self.local[0], rtp=9)
        msg = _with_to(request("INVITE", ruri, self.local, call_id, from_tag, 1, extra=extra, body=body), to_uri)
        self.send(msg, to)
        response = self.final(call_id)
        sent = msg
        if response is not None and status_of(response) == 407 and user:
            self.ack_failure(to, msg, response)
            auth = digest(header(response, "Proxy-Authenticate"), "INVITE", ruri, user, PASSWORDS[user])
            sent = _with_to(request("INVITE", ruri, self.local, call_id, from_tag, 2,
                                    extra=extra + f"\nProxy-Authorization: {auth}", body=body), to_uri)
            self.send(sent, to)
            response = self.final(call_id)
        dialog = {"call_id": call_id, "from_tag": from_tag, "uri": ruri, "sent": sent}
        if response is not None:
            m = re.search(r"tag=([^;>\s]+)", header(response, "To"))
            dialog["to_tag"] = m.group(1) if m else None
            dialog["response"] = response
        return (status_of(response) if response else None), response, dialog

    def ack_failure(self, to, invite: bytes, response: bytes) -> None:
        """ACK a non-2xx final response (same branch, the To-tag of the response)."""
        text = invite.decode()
        via = re.search(r"(?m)^Via: .*$", text).group(0).rstrip("\r")
        cseq = re.search(r"(?m)^CSeq: (\d+)", text).group(1)
        ruri = text.split(" ", 2)[1]
        lines = [f"ACK {ruri} SIP/2.0", via, "Max-Forwards: 70",
                 re.search(r"(?m)^From: .*$", text).group(0).rstrip("\r"), f"To: {header(response, 'To')}",
                 f"Call-ID: {header(response, 'Call-ID')}", f"CSeq: {cseq} ACK", "Content-Length: 0"]
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode(), to)

    def ack_and_bye(self, to, dialog: dict) -> None:
        """End an answered call: ACK the 200 and BYE, along the Record-Route (through Kamailio)."""
        response = dialog["response"]
        route = ", ".join(r.decode() for r in re.findall(rb"(?im)^Record-Route:\s*(.*?)\r?$", response))
        contact = re.search(r"<([^>]+)>", header(response, "Contact")).group(1)
        extra = f"Route: {route}" if route else ""
        for method, cseq in (("ACK", 2 if b"Proxy-Authorization" in dialog["sent"] else 1), ("BYE", 3)):
            self.send(request(method, contact, self.local, dialog["call_id"], dialog["from_tag"], cseq,
                              dialog["to_tag"], extra=extra), to)
        self.final(dialog["call_id"], 3.0)


def _with_to(msg: bytes, to_uri: str | None) -> bytes:
    if to_uri is None:
        return msg
    return re.sub(rb"(?m)^To: <[^>]*>", f"To: <{to_uri}>".encode(), msg, count=1)


@pytest.fixture(scope="module", params=["memory", "postgres"])
def center(request, tmp_path_factory):
    """A worker with a contact center (alice and bob, available) behind a Kamailio that
    authenticates callers (carol) and agents (alice, bob), and trusts the balancer only; Kamailio
    keeps its users in its config (memory) or in PostgreSQL (the store's database flavour)."""
    from callcenter.lab.agent_process import AgentProcess
    from callcenter.store.queues import QueueStore

    d = tmp_path_factory.mktemp("agents")
    balancer = free_udp_port()
    agent = AgentProcess(d / "agent", free_udp_port(), rtp_base(), ROOT / "flows" / "support.yaml", extra_config=(
        f"trusted_proxies: ['127.0.0.1:{balancer}']\n"
        f"contact_center:\n  registrar: 127.0.0.1:{balancer}\n"
        "  agents:\n    - {name: alice}\n    - {name: bob}\n")).start()
    env = dict(os.environ, **{f"{u.upper()}_PW": p for u, p in PASSWORDS.items()})
    log = d / "kamailio.log"
    kam, uac = None, Uac()
    try:
        subprocess.run([sys.executable, "-m", "callcenter.cli", "kamailio-config", "--worker",
                        agent.uri.replace("agent@", ""), "--listen", f"127.0.0.1:{balancer}", "--out",
                        str(d / "cfg"), "--caller", "carol=CAROL_PW", "--agent", "alice=ALICE_PW", "--agent",
                        "bob=BOB_PW", "--rate-limit", "200",
                        *(["--db", request.getfixturevalue("postgres_server").new_database()]
                          if request.param == "postgres" else [])], check=True, capture_output=True, env=env)
        kam = KamailioProcess(d / "cfg" / "kamailio.cfg", log, d / "k.pid")
        # up when it answers OPTIONS
        assert wait_for(lambda: _options_ok(uac, balancer), 10), log.read_text()[-3000:]
        store = QueueStore(agent.store, "test")
        yield {"kam": ("127.0.0.1", balancer), "worker": ("127.0.0.1", agent.sip_port), "agent": agent,
               "store": store, "log": log, "uac": uac}
    finally:
        uac.close()
        if kam is not None:
            kam.stop()
        agent.stop()


def _options_ok(uac: Uac, port: int) -> bool:
    call_id = uuid.uuid4().hex
    uac.send(request("OPTIONS", f"sip:127.0.0.1:{port}", uac.local, call_id, "o", 1), ("127.0.0.1", port))
    response = uac.final(call_id, 0.5)
    return response is not None and status_of(response) == 200


def states(store) -> dict[str, str]:
    return {name: store.agent(name).state.value for name in ("alice", "bob")}


@pytest.mark.parametrize("form", list(AGENT_FORMS))
def test_a_caller_cannot_log_an_agent_out_through_kamailio(center, form):
    """carol authenticates as a caller and names bob in the agent header, the code only in To (the
    balancer checks the Request-URI): refused before authentication, whatever the header's form."""
    before = states(center["store"])
    kam = center["kam"]
    code, response, _ = center["uac"].invite(kam, f"sip:agent@{kam[0]}:{kam[1]}", to_uri=f"sip:*42@{kam[0]}:{kam[1]}",
                                             extra=AGENT_FORMS[form], user="carol")
    assert code == 403, response
    time.sleep(0.5)
    assert states(center["store"]) == before == {"alice": "available", "bob": "available"}
    assert "carries X-Callcenter-Agent itself" in center["log"].read_text()


def test_a_code_only_in_to_is_an_ordinary_call(center):
    """No agent header, the code in To only: carol's call reaches the worker as a caller's call,
    and nobody's state changes (the worker reads the code from the Request-URI)."""
    kam = center["kam"]
    uac = center["uac"]
    code, response, dialog = uac.invite(kam, f"sip:agent@{kam[0]}:{kam[1]}", to_uri=f"sip:*42@{kam[0]}:{kam[1]}",
                                        user="carol")
    assert code == 200, response
    uac.ack_and_bye(kam, dialog)
    assert states(center["store"]) == {"alice": "available", "bob": "available"}


@pytest.mark.parametrize("form", list(AGENT_FORMS))
def test_the_worker_takes_an_agent_only_from_its_trusted_proxy(center, form):
    """Straight to the worker, no credentials, `*42` in the Request-URI and To, bob in the header:
    the packet is not from the balancer's address and port, so the header is ignored (logged) and
    the call is an ordinary one."""
    worker = center["worker"]
    uac = center["uac"]
    ruri = f"sip:*42@{worker[0]}:{worker[1]}"
    code, response, dialog = uac.invite(worker, ruri, extra=AGENT_FORMS[form])
    assert code == 200, response
    uac.ack(worker, dialog)
    uac.bye(worker, dialog)
    time.sleep(0.3)
    assert states(center["store"]) == {"alice": "available", "bob": "available"}
    assert wait_for(lambda: '"sip_agent_header_ignored"' in center["agent"].log(), 5)


def test_an_agents_own_code_works_once_and_cannot_be_replayed(center):
    """alice dials *45 with her credentials (qop=auth): paused. The same authorised INVITE sent
    again, from another socket with a new transaction, is challenged anew (one-time nonce), and
    alice's state is not touched by it."""
    kam, uac, store = center["kam"], center["uac"], center["store"]
    ruri = f"sip:*45@{kam[0]}:{kam[1]}"
    code, response, dialog = uac.invite(kam, ruri, user="alice")
    assert code == 200, response
    assert wait_for(lambda: store.agent("alice").state.value == "paused", 5)
    uac.ack_and_bye(kam, dialog)
    assert b"qop" in dialog["sent"] and b"nc=00000001" in dialog["sent"]
    store.set_agent_state("alice", "resume", "")
    thief = Uac()
    try:
        replay = re.sub(rb"branch=z9hG4bK\w+", b"branch=z9hG4bKreplayed1", dialog["sent"])
        thief.send(replay, kam)
        answer = thief.final(dialog["call_id"], 3.0)
    finally:
        thief.close()
    assert answer is not None and status_of(answer) in (401, 403, 407), answer
    time.sleep(0.5)
    assert store.agent("alice").state.value == "available"


def _register(uac: Uac, kam, user: str, contacts: list[str]) -> int | None:
    call_id = uuid.uuid4().hex
    ruri = f"sip:{kam[0]}:{kam[1]}"
    extra = "".join(f"\nContact: <{c}>" for c in contacts) + "\nExpires: 60"

    def msg(cseq: int, auth: str = "") -> bytes:
        m = request("REGISTER", ruri, uac.local, call_id, "r" + call_id[:6], cseq, extra=extra + auth)
        m = re.sub(rb"(?m)^From: <[^>]*>", f"From: <sip:{user}@{kam[0]}>".encode(), m, count=1)
        m = re.sub(rb"(?m)^To: <[^>]*>", f"To: <sip:{user}@{kam[0]}>".encode(), m, count=1)
        return re.sub(rb"(?m)^Contact: <sip:caller@[^>]*>\r\n", b"", m, count=1)

    uac.send(msg(1), kam)
    response = uac.final(call_id)
    if response is not None and status_of(response) == 401:
        auth = digest(header(response, "WWW-Authenticate"), "REGISTER", ruri, user, PASSWORDS[user])
        uac.send(msg(2, f"\nAuthorization: {auth}"), kam)
        response = uac.final(call_id)
    return status_of(response) if response else None


def test_an_agent_registers_one_contact_at_their_own_address(center):
    kam, uac = center["kam"], center["uac"]
    me = f"{uac.local[0]}:{uac.local[1]}"
    assert _register(uac, kam, "bob", ["sip:+19005550100@192.0.2.77:5060"]) == 403  # a gateway
    assert _register(uac, kam, "bob", [f"sip:bob@{me}", "sip:bob@192.0.2.8:5060"]) == 403  # forked
    assert _register(uac, kam, "bob", [f"sip:bob@{me}", f"sip:bob2@{me}"]) in (403, 503)  # two
    assert _register(uac, kam, "bob", [f"sip:bob@{me}"]) == 200
    assert "is not the sender" in center["log"].read_text()


def test_a_route_of_the_callers_own_beyond_kamailio_is_refused(center):
    """Inside carol's own call, a MESSAGE and a re-INVITE whose Route names Kamailio and then an
    address of her choosing (toll fraud from the balancer's address): refused, and the chosen
    socket hears nothing."""
    kam, uac = center["kam"], center["uac"]
    target = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    target.bind(("127.0.0.1", 0))
    code, response, dialog = uac.invite(kam, f"sip:agent@{kam[0]}:{kam[1]}", user="carol")
    assert code == 200, response
    rr = re.findall(rb"(?im)^Record-Route:\s*(.*?)\r?$", response)[0].decode()
    victim = f"sip:+19005550100@127.0.0.1:{target.getsockname()[1]};lr"
    codes = []
    try:
        for i, (method, body) in enumerate((("MESSAGE", "free calls"), ("INVITE", ""))):
            msg = request(method, "sip:+19005550100@127.0.0.1", uac.local, dialog["call_id"], dialog["from_tag"],
                          10 + i, dialog["to_tag"], extra=f"Route: {rr}, <{victim}>", body=body)
            uac.send(msg, kam)
            answer = uac.final(dialog["call_id"], 3.0)
            codes.append(status_of(answer) if answer else None)
        target.settimeout(1.5)
        try:
            heard = target.recvfrom(65535)[0]
        except socket.timeout:
            heard = None
    finally:
        target.close()
        uac.ack_and_bye(kam, dialog)
    assert heard is None, heard
    assert codes == [403, 403], codes
    assert "a Route beyond ours" in center["log"].read_text()
