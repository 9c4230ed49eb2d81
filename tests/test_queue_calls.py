"""A contact center with real components: two hosts (network namespaces) with 2 workers each, on
one PostgreSQL; Kamailio on the same database as registrar and dispatcher in front of them; three
baresip agent phones registered with digest authentication; six baresip callers who speak and land
in one queue. What each caller heard (hold music, their place in line) and what each agent heard
(the whisper summary) is transcribed; a whole host is killed with kill -9 while callers wait on
both; the max-wait path is taken by a caller nobody answers."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request
import uuid

import numpy as np
import pytest

from callcenter.audio.wavfile import read_wav
from callcenter.call.events import read_events
from callcenter.lab.balancer import KamailioProcess
from callcenter.lab.fleet import Fleet
from callcenter.lab.fleet import control_request as api
from callcenter.lab.hosts import HostNetwork
from callcenter.lab.softphone import Softphone, caller_audio
from callcenter.store.calls import CallRecords
from callcenter.store.db import open_database
from callcenter.store.url import StoreUrl
from callcenter.telephony.config import load_server_config
from callcenter.telephony.kamailio import write_kamailio_config
from callcenter.workers import fleet_control_urls
from tests.conftest import free_tcp_port, free_udp_port, rtp_base
from tests.pg import Postgres, pg_bin

pytestmark = [pytest.mark.sip, pytest.mark.slow]

if not shutil.which("baresip") or not shutil.which("kamailio") or pg_bin() is None:
    pytest.skip("baresip, kamailio and postgresql are needed (scripts/setup installs them)", allow_module_level=True)

FLOW = """
name: queue-test
start: welcome
queues:
  help:
    agents: [alice, bob, carol]
    strategy: longest_idle
    ring_timeout_s: 4
    wrap_up_s: 2
    announce_every_s: 15
    max_wait_s: {max_wait}
nodes:
  welcome:
    type: ask
    prompt: Thanks for calling. What is your call about?
    timeout_s: 6
    max_attempts: 1
    on_failure: wait
    intents:
      billing:
        examples: [billing, a question about my bill, my invoice]
        next: wait
  wait:
    type: transfer
    queue: help
    on_timeout: voicemail
  voicemail:
    type: voicemail
    prompt: Nobody is free right now. Please leave a message after the tone.
    max_s: 5
    next: bye
  bye:
    type: hangup
    text: Goodbye.
"""

PASSWORDS = {"alice": "alice-secret-1", "bob": "bob-secret-2", "carol": "carol-secret-3"}


def words(stt, pcm: bytes) -> set[str]:
    return set(re.findall(r"[a-z]+", stt.transcribe_pcm(pcm).text.lower()))


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def tonal(pcm: bytes) -> bool:
    """Music, not speech or noise: a loud frame whose spectrum is a few sharp peaks."""
    x = np.frombuffer(pcm, "<i2").astype(float)
    if len(x) < 4000 or np.sqrt(np.mean(x ** 2)) < 100:
        return False
    spec = np.abs(np.fft.rfft(x[:4000] * np.hanning(4000)))
    top = np.sort(spec)[-12:].sum()
    return top / spec.sum() > 0.25


@pytest.fixture
def two_hosts(tmp_path):
    """Two hosts (network namespaces with addresses of their own, or loopback addresses where the
    machine allows no namespaces) and, on this machine, the PostgreSQL they share."""
    net = HostNetwork(2).start()
    pg = None
    try:
        pg = Postgres(free_tcp_port(), address=net.gateway, clients=net.subnet).start()
        yield net, pg
    finally:
        if pg is not None:
            pg.close()
        net.close()


def test_six_callers_wait_in_one_queue_across_two_hosts_and_reach_agents(tmp_path, caller_voice, stt, two_hosts):
    net, pg = two_hosts
    store, gw = pg.new_database(), net.gateway
    balancer, control, token = free_udp_port(), 8470, "two-hosts-" + uuid.uuid4().hex
    flow = tmp_path / "queue.yaml"
    flow.write_text(FLOW.format(max_wait=240))
    agents_yaml = "".join(f"    - {{name: {n}, logged_in: false}}\n" for n in PASSWORDS)
    env = dict(os.environ, CALLCENTER_TOKEN=token)
    hosts = [Fleet(tmp_path / f"host{i}", flow, 2, 5070, balancer, rtp_port=rtp_base(), host=address,
                   prefix=net.prefix(i), balancer=gw, env=env,
                   extra_config=f"store: {store}\ncontrol: {{host: {address}, port: {control}}}\n"
                                f"contact_center:\n  registrar: {gw}:{balancer}\n  agents:\n{agents_yaml}")
             for i, address in enumerate(net.addresses)]
    urls = [f"http://{h.host}:{control + w}" for h in hosts for w in range(2)]
    phones: list[Softphone] = []
    kam = None
    try:
        for host in hosts:
            host.launch()
        for host in hosts:
            host.wait_started()
        # Kamailio on this machine, on the database: the four workers are rows of its dispatcher table
        cfg = write_kamailio_config(tmp_path / "kam", f"{gw}:{balancer}", hosts[0].worker_uris() +
                                    hosts[1].worker_uris(), agents=PASSWORDS, db=StoreUrl.parse(store))
        kam = KamailioProcess(cfg, tmp_path / "kamailio.log", tmp_path / "kam.pid")
        survivor = urls[-1]  # a worker on the second host
        wait_until(lambda: all(len(h.log_lines("control_listening")) >= 2 for h in hosts), 30, "the control APIs")
        # the agents' phones register with Kamailio; carol's rings but is never answered
        hello = {n: caller_voice(f"agent_{n}", f"Hello, this is {n.title()}. I can help you with that.")
                 for n in PASSWORDS}
        agents = {}
        for n in PASSWORDS:
            mic = caller_audio([hello[n]], tmp_path / f"{n}-mic.wav", lead_s=1.0, gap_s=0, tail_s=3.0)
            phone = Softphone(tmp_path / f"phone-{n}", mic, user=n, registrar=f"{gw}:{balancer}",
                              password=PASSWORDS[n], answer=n != "carol", host=gw).start()
            phones.append(phone)
            agents[n] = phone
            assert phone.wait_registered(10), phone.log()
        # alice logs in and pauses (on the first host's API): the state is the store's, not a host's
        assert api(urls[0], token, "/api/agents/alice/login", {})["state"] == "available"
        assert api(urls[0], token, "/api/agents/alice/pause", {"reason": "coffee"})["state"] == "paused"
        wait_until(lambda: all(h.warmed() for h in hosts), 120, "prompts warmed")
        # six callers say what they want, then wait (quietly) in the queue
        said = caller_voice("bill", "I have a question about my bill.")
        callers = []
        for i in range(6):
            mic = caller_audio([said], tmp_path / f"caller{i}.wav", lead_s=4.0, gap_s=0, tail_s=150)
            phone = Softphone(tmp_path / f"caller{i}", mic, user=f"caller{i}", host=gw)
            phones.append(phone)
            phone.dial(hosts[0].uri)
            callers.append(phone)
            time.sleep(0.8)
        for phone in callers:
            assert phone.wait_established(15), phone.log()
        board = wait_until(lambda: (b := api(survivor, token, "/api/queues"))["queues"] and
                           b["queues"][0]["waiting"] == 6 and b, 60, "six callers in the queue")
        order = [c["call_id"] for c in board["queues"][0]["callers"]]
        on = {c["call_id"]: c["worker"] for c in board["queues"][0]["callers"]}
        first = {u.removeprefix("sip:") for u in hosts[0].worker_uris()}
        assert set(on.values()) & first and set(on.values()) - first, on  # callers on both hosts
        before = {a["name"]: a["state"] for a in board["agents"]}
        assert before == {"alice": "paused", "bob": "logged_out", "carol": "logged_out"}, before
        # the console (`tui --config` on any host) finds all four workers in the store
        assert sorted(fleet_control_urls(load_server_config(hosts[1].config))) == sorted(urls)
        # the first host dies whole: kill -9 of its pool and workers, and off the network
        hosts[0].kill()
        net.isolate(0)
        survivors = [c for c in order if on[c] not in first]
        board = wait_until(lambda: (b := api(survivor, token, "/api/queues"))["queues"][0]["waiting"] ==
                           len(survivors) and b, 30, "the dead host's callers to leave the queue")
        assert [c["call_id"] for c in board["queues"][0]["callers"]] == survivors
        assert {a["name"]: a["state"] for a in board["agents"]} == before  # agents keep their states
        # every call the dead host had ends in the store as worker_lost; the others are still open
        records = CallRecords(open_database(store), "", "")

        def outcomes():
            return {c["call_id"]: c["outcome"] for c in records.between(0, time.time() + 60)}
        wait_until(lambda: all(outcomes()[c] == "worker_lost" for c in order if on[c] in first), 15,
                   "the dead host's calls to end as worker_lost")
        assert all(outcomes()[c] is None for c in survivors), outcomes()
        assert sorted(fleet_control_urls(load_server_config(hosts[1].config))) == urls[2:]
        # the agents come in (from the console's API), longest idle first: alice, then bob, then carol
        assert api(survivor, token, "/api/agents/alice/resume", {})["state"] == "available"
        time.sleep(0.3)
        for n in ("bob", "carol"):
            assert api(survivor, token, f"/api/agents/{n}/login", {})["state"] == "available"
            time.sleep(0.3)

        def all_served():
            b = api(survivor, token, "/api/queues")
            return b["queues"][0]["answered_today"] == len(survivors) and \
                all(a["state"] in ("available", "wrap_up") for a in b["agents"] if a["name"] != "carol")
        wait_until(all_served, 120, "every caller answered and their agent's call over")
        assert api(survivor, token, "/api/queues")["queues"][0]["waiting"] == 0
        center = [json.loads(line) for h in hosts for f in h.recordings.glob("contact-center-*.jsonl")
                  for line in f.read_text().splitlines()]
        assert sorted((e["agent"], e["action"], e["by"]) for e in center if e["kind"] == "agent_state") == \
            sorted([("alice", "login", "supervisor"), ("alice", "pause", "supervisor"),
                    ("alice", "resume", "supervisor"), ("bob", "login", "supervisor"),
                    ("carol", "login", "supervisor")])
        req = urllib.request.Request(survivor + "/metrics", headers={"Authorization": f"Bearer {token}"})
        metrics = urllib.request.urlopen(req, timeout=10).read().decode()
        assert f'callcenter_queue_answered_today{{queue="help"}} {len(survivors)}' in metrics, metrics[-2000:]
        for phone in callers:
            phone.close()
        for phone in agents.values():
            phone.close()
        time.sleep(1)
        # every surviving call: hold music, its place announced, then an agent
        by_id = {p.stem: p for p in hosts[1].calls()}
        rings = []
        for call_id in survivors:
            events = read_events(by_id[call_id])
            q = [e for e in events if e["kind"] == "queue"]
            rings += [(e["wall"], e["agents"]) for e in q if e["what"] == "ring"]
            assert any(e["what"] == "position" for e in q), q
            done = [e for e in events if e["kind"] == "transfer" and e.get("mode") == "queue"]
            assert done and done[0]["accepted"], events[-5:]
            whisper = next(e for e in events if e["kind"] == "agent_whisper")
            assert "billing" in whisper["text"], whisper
        first_rings = sorted(rings)
        assert [a for _, a in first_rings[:2]] == [["alice"], ["bob"]][:len(survivors)], first_rings
        # what callers heard: music, then "you are number N in line"
        heard_place = 0
        for phone in callers:
            for wav in phone.received_wavs():
                pcm = read_wav(wav)
                if len(pcm) < 16000 * 12:
                    continue
                heard = words(stt, pcm[:16000 * 30])
                heard_place += bool({"number", "line"} <= heard or {"expected", "wait"} <= heard)
                chunks = [pcm[i:i + 8000] for i in range(0, min(len(pcm), 16000 * 40), 8000)]
                assert any(tonal(c) for c in chunks), f"no hold music in {wav}"
        assert heard_place >= len(survivors), heard_place
        # what agents heard first: the whisper, alone
        for n in ("alice", "bob")[:len(survivors)]:
            wavs = agents[n].received_wavs()
            assert wavs, agents[n].log()
            assert {"caller", "billing"} & words(stt, read_wav(wavs[0])[:16000 * 6]), n
        assert agents["carol"].calls_answered() == 0
    finally:
        for phone in phones:
            phone.close()
        if kam is not None:
            kam.stop()
        for host in hosts:
            host.stop()


def test_keypad_codes_then_unreachable_agents_and_the_max_wait_way(tmp_path, caller_voice, stt):
    """*45 and *46 dialled from a registered agent phone: Kamailio authenticates the agent and names
    them to the worker, which changes their state and says so; a caller cannot dial a code. Then a
    caller queues while no agent's phone is registered: each is paused as unreachable (480 from
    Kamailio, or 404 for agents it was not told of), no phone is rung in a loop, and after
    max_wait_s the caller goes the flow's on_timeout way, to voicemail."""
    sip, balancer = free_udp_port(), free_udp_port()
    flow = tmp_path / "queue.yaml"
    flow.write_text(FLOW.format(max_wait=8))
    fleet = Fleet(tmp_path, flow, 1, sip, balancer, rtp_port=rtp_base(), agents={"alice": PASSWORDS["alice"]},
                  extra_config=f"contact_center:\n  registrar: 127.0.0.1:{balancer}\n  agents:\n"
                               f"    - {{name: alice, logged_in: false}}\n    - {{name: bob}}\n    - {{name: carol}}\n")
    try:
        fleet.start()
        from callcenter.store.queues import AgentState, QueueStore

        store = QueueStore(fleet.store, "test")
        mic = caller_audio([], tmp_path / "silence.wav", lead_s=8, gap_s=0, tail_s=0)
        for code, state, said in (("*41", AgentState.AVAILABLE, "calls"), ("*45", AgentState.PAUSED, "paused"),
                                  ("*46", AgentState.AVAILABLE, "available")):
            phone = Softphone(tmp_path / f"alice{code[1:]}", mic, user="alice", registrar=f"127.0.0.1:{balancer}",
                              password=PASSWORDS["alice"]).start()
            try:
                assert phone.wait_registered(10), phone.log()
                phone.send(f"/dial sip:{code}@127.0.0.1:{balancer}")
                assert phone.wait_ended(30), phone.log()
                assert store.agent("alice").state == state
                heard = words(stt, read_wav(phone.received_wav()))
                assert said in heard, heard
            finally:
                phone.close()
        # a caller who is not an agent cannot dial a code (no credentials: challenged, then refused)
        with Softphone(tmp_path / "mallory", mic, user="mallory") as phone:
            phone.dial(f"sip:*45@127.0.0.1:{balancer}")
            assert not phone.wait_established(5)
        assert store.agent("alice").state == AgentState.AVAILABLE
        # now nobody's phone is registered (alice's has quit): a caller waits in vain
        said = caller_voice("bill", "I have a question about my bill.")
        caller_mic = caller_audio([said], tmp_path / "mic.wav", lead_s=4.0, gap_s=0, tail_s=30)
        with Softphone(tmp_path / "phone", caller_mic) as phone:
            phone.dial(fleet.uri)
            assert phone.wait_established(10), phone.log()
            assert phone.wait_ended(60), phone.log()
            heard = read_wav(phone.received_wav())
        events = read_events(fleet.calls()[-1])
        left = [e for e in events if e["kind"] == "queue" and e["what"] == "left"]
        assert left and left[0]["why"] == "timeout", [e for e in events if e["kind"] == "queue"]
        assert sum(e["kind"] == "queue" and e["what"] == "ring" for e in events) == 3  # each once, then paused
        assert any(e["kind"] == "voicemail" for e in events) or \
            any(e["kind"] == "flow_decision" and e.get("next_node") == "voicemail" for e in events)
        assert {"message", "tone"} <= words(stt, heard), "the caller heard the voicemail prompt"
        for name in ("alice", "bob", "carol"):
            agent = store.agent(name)
            assert agent.state == AgentState.PAUSED and agent.reason.startswith("unreachable: "), agent
        assert "480" in store.agent("alice").reason  # Kamailio: her phone is not registered (any more)
        assert "404" in store.agent("bob").reason  # not an agent Kamailio knows (not in --agent)
        center = [json.loads(line) for f in fleet.recordings.glob("contact-center-*.jsonl")
                  for line in f.read_text().splitlines()]
        assert [(e["action"], e["by"]) for e in center][:3] == [("login", "keypad"), ("pause", "keypad"),
                                                               ("resume", "keypad")]
        assert sorted(e["agent"] for e in center if e["action"] == "autopause") == ["alice", "bob", "carol"]
    finally:
        fleet.stop()
