"""Queues of human agents without a call: the shared store (strategies, places, ring-outs,
unreachable phones, wrap-up, agent states, the console's figures, a worker killed with kill -9
while another worker's callers wait), hold music through µ-law, the flow model and the engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from callcenter.audio.g711 import ulaw_roundtrip
from callcenter.dialog.engine import Dialog, Enqueue, Hangup
from callcenter.dialog.flow import QueueSettings, load_flow
from callcenter.store.queues import WORKER_STALE_S, AgentState, QueueStore, QueueStoreError
from callcenter.voice.hold_music import hold_music
from callcenter.yamlfile import UserFileError


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t


def store(url, worker="w1", clock=None, agents=(("alice", ()), ("bob", ()), ("carol", ("billing",)))):
    s = QueueStore(url, worker, clock=clock or Clock())
    s.define_agents([(name, f"sip:{name}@127.0.0.1", skills, True) for name, skills in agents])
    s.heartbeat()
    return s


def test_longest_idle_rings_the_agent_free_longest_and_only_the_first_caller(store_url):
    clock = Clock()
    s = store(store_url, clock=clock)
    s.define_queue("sales", ["alice", "bob"], [], "longest_idle", 20)
    clock.t += 1
    s.set_agent_state("alice", "pause", "lunch")
    clock.t += 1
    s.set_agent_state("alice", "resume")  # alice is idle from now; bob since the start
    s.join("c1", "sales")
    clock.t += 1
    s.join("c2", "sales")
    assert s.claim("c2") is None, "the second caller never jumps the first"
    ring = s.claim("c1")
    assert [a.name for a in ring.agents] == ["bob"]
    assert s.agent("bob").state == AgentState.RINGING
    ring2 = s.claim("c2")  # c1 is ringing someone: c2 is first in line now
    assert [a.name for a in ring2.agents] == ["alice"]
    assert s.claim("c1") is None  # nobody left, and c1 is ringing anyway


def test_ring_out_keeps_the_callers_place_and_tries_the_next_agent(store_url):
    clock = Clock()
    s = store(store_url, clock=clock)
    s.define_queue("sales", ["alice", "bob"], [], "round_robin", 20)
    s.join("c1", "sales")
    clock.t += 5
    s.join("c2", "sales")
    first = s.claim("c1").agents[0].name
    s.ring_ended("c1", None, [first])
    assert s.position("c1") == (1, 2) and s.position("c2") == (2, 2)
    second = s.claim("c1").agents[0].name
    assert second != first, "the agent who did not answer is not rung again at once"
    s.ring_ended("c1", second, [second])
    assert s.agent(second).state == AgentState.ON_CALL
    assert s.position("c2") == (1, 1) and s.position("c1") == (0, 0)


def test_ring_all_rings_every_free_agent_and_frees_the_others(store_url):
    s = store(store_url)
    s.define_queue("billing", ["alice"], ["billing"], "ring_all", 20)
    s.join("c1", "billing")
    ring = s.claim("c1")
    assert sorted(a.name for a in ring.agents) == ["alice", "carol"]
    s.ring_ended("c1", "carol", ["alice", "carol"])
    assert s.agent("carol").state == AgentState.ON_CALL and s.agent("alice").state == AgentState.AVAILABLE


def test_an_unreachable_phone_pauses_its_agent_with_the_reason(store_url):
    s = store(store_url)
    s.define_queue("sales", ["alice"], [], "longest_idle", 20)
    s.join("c1", "sales")
    s.claim("c1")
    s.ring_ended("c1", None, ["alice"], unreachable={"alice": "480 Temporarily Unavailable"})
    a = s.agent("alice")
    assert a.state == AgentState.PAUSED and "480" in a.reason
    assert s.claim("c1") is None


def test_wrap_up_then_available_and_agent_actions(store_url):
    clock = Clock()
    s = store(store_url, clock=clock)
    s.define_queue("sales", ["alice"], [], "longest_idle", 20)
    s.join("c1", "sales")
    s.claim("c1")
    s.ring_ended("c1", "alice", ["alice"])
    with pytest.raises(QueueStoreError, match="on_call"):
        s.set_agent_state("alice", "logout")
    clock.t += 60
    s.agent_call_ended("alice", "sales", 10, 60)
    assert s.agent("alice").state == AgentState.WRAP_UP
    clock.t += 11
    assert s.agent("alice").state == AgentState.AVAILABLE
    s.set_agent_state("alice", "logout")
    assert s.agent("alice").state == AgentState.LOGGED_OUT
    with pytest.raises(QueueStoreError, match="cannot resume"):
        s.set_agent_state("alice", "resume")
    with pytest.raises(QueueStoreError, match="no agent"):
        s.set_agent_state("zed", "login")
    # the expected wait learns from the handled call: 70 s of talk and wrap-up
    s.set_agent_state("alice", "login")
    s.join("c2", "sales")
    assert s.expected_wait_s("c2") == pytest.approx(70)


def test_the_console_figures(store_url):
    clock = Clock()
    s = store(store_url, clock=clock)
    s.define_queue("sales", ["alice", "bob"], [], "longest_idle", 20)
    for cid in ("c1", "c2", "c3", "c4"):
        s.join(cid, "sales")
    clock.t += 10
    assert [a.name for a in s.claim("c1").agents] == ["alice"]  # idle as long as bob: by name
    s.ring_ended("c1", "alice", ["alice"])  # answered in 10 s: within the service level
    clock.t += 30
    s.leave("c2", "abandoned")
    s.leave("c3", "callback")
    s.set_agent_state("bob", "pause", "training")
    queues, agents = s.snapshot()
    q = queues[0]
    assert (q.waiting, q.available, q.busy, q.paused) == (1, 0, 1, 1)
    assert (q.answered_today, q.abandoned_today, q.callbacks_today) == (1, 1, 1)
    assert q.service_level == 0.5 and q.longest_wait_s == pytest.approx(40)
    assert {a.name: (a.state, a.reason) for a in agents}["bob"] == (AgentState.PAUSED, "training")


WORKER = textwrap.dedent("""
    import sys, time
    from callcenter.store.queues import QueueStore
    s = QueueStore(sys.argv[1], sys.argv[2])
    s.heartbeat()
    for cid in sys.argv[3:]:
        s.join(cid, "sales")
        time.sleep(0.05)
    print("joined", flush=True)
    while True:
        s.heartbeat()
        time.sleep(0.2)
""")


def test_a_killed_worker_leaves_the_others_callers_in_their_places(store_url):
    """Two worker processes queue callers alternately; one is killed with kill -9: its callers leave
    the queue within WORKER_STALE_S, and the other worker's callers keep their order, moving up; on
    SQLite and on PostgreSQL alike."""
    db = store_url
    QueueStore(db, "setup").define_queue("sales", ["alice"], [], "longest_idle", 20)
    procs = []
    try:
        for worker, calls in (("a", ["a1", "a2"]), ("b", ["b1", "b2"])):
            p = subprocess.Popen([sys.executable, "-c", WORKER, str(db), worker, *calls], stdout=subprocess.PIPE)
            assert p.stdout.readline().strip() == b"joined"
            procs.append(p)
        watcher = QueueStore(db, "watcher")
        watcher.heartbeat()
        assert [watcher.position(c)[0] for c in ("a1", "a2", "b1", "b2")] == [1, 2, 3, 4]
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        deadline = time.monotonic() + WORKER_STALE_S + 5
        while watcher.position("a1")[0] and time.monotonic() < deadline:
            time.sleep(0.2)
            watcher.heartbeat()
        assert [watcher.position(c)[0] for c in ("a1", "a2", "b1", "b2")] == [0, 0, 1, 2]
        queues, _ = watcher.snapshot()
        assert queues[0].waiting == 2
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_hold_music_survives_mu_law():
    pcm = hold_music()
    x = np.frombuffer(pcm, "<i2").astype(float)
    y = np.frombuffer(ulaw_roundtrip(pcm), "<i2").astype(float)
    snr = 10 * np.log10(np.sum(x ** 2) / np.sum((x - y) ** 2))
    assert snr > 30, snr
    spec = np.abs(np.fft.rfft(x[:8000 * 8]))
    f = np.fft.rfftfreq(8000 * 8, 1 / 8000)
    in_band = spec[(f >= 300) & (f <= 3400)] ** 2
    assert in_band.sum() / (spec ** 2).sum() > 0.97  # the phone line keeps it
    rms = np.sqrt(np.mean(x ** 2)) / 32768
    assert -23 < 20 * np.log10(rms) < -17
    seam = abs(x[0] - x[-1])
    assert seam < 2000, "the loop joins without a click"


FLOW = """
name: q
start: ask
queues:
  help:
    agents: [alice]
    max_wait_s: 60
  desk: sip:desk@127.0.0.1:5099
nodes:
  ask:
    type: ask
    prompt: Your account number?
    slots:
      account: {type: digits, min_length: 4, max_length: 8}
    next: wait
    on_failure: bye
  wait:
    type: transfer
    queue: help
    text: Putting you through.
    on_timeout: voicemail
    on_callback: callback
    on_failure: bye
  voicemail:
    type: voicemail
    next: bye
  callback:
    type: say
    text: We will call you back.
    next: bye
  bye:
    type: hangup
    text: Goodbye.
"""


def test_a_queue_node_enqueues_with_the_triage_whisper_and_each_outcome_has_its_node(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text(FLOW)
    flow = load_flow(path)
    d = Dialog(flow)
    d.start()
    actions = d.on_utterance("it is 4 4 7 1")
    enq = [a for a in actions if isinstance(a, Enqueue)][0]
    assert enq.queue == "help" and enq.settings.agents == ["alice"]
    assert enq.whisper.startswith("A caller for help.") and "account: 4471" in enq.whisper
    for result, node in (("timeout", "voicemail"), ("callback", "callback"), ("unavailable", "bye")):
        d2 = Dialog(flow)
        d2.start()
        d2.on_utterance("4471")
        d2.on_queue_left(result)
        after = d2.path[d2.path.index("wait") + 1]
        assert after == node and d2.variables["queue_result"] == result
    bare = Dialog(load_flow(path))
    bare.start()
    bare.on_utterance("4471")
    bare.flow.nodes["wait"].on_failure = None
    bare.flow.nodes["wait"].on_timeout = None
    assert isinstance(bare.on_queue_left("timeout")[-1], Hangup)


@pytest.mark.parametrize("bad, message", [
    ("    strategy: random\n", "strategy"),
    ("    callback_key: '12'\n", "keypad"),
    ("    music: nope.wav\n", "hold music"),
])
def test_queue_settings_errors_say_where(tmp_path, bad, message):
    path = tmp_path / "q.yaml"
    path.write_text(FLOW.replace("    max_wait_s: 60\n", "    max_wait_s: 60\n" + bad))
    with pytest.raises(UserFileError) as err:
        load_flow(path)
    assert message in str(err.value) and "q.yaml:" in str(err.value)


def test_a_queue_needs_someone_to_answer_it():
    with pytest.raises(ValueError, match="agents or skills"):
        QueueSettings()


def test_a_phone_that_turns_calls_down_at_once_is_not_rung_again_for_a_while(store_url):
    from callcenter.store.queues import RETRY_S

    clock = Clock()
    s = store(store_url, clock=clock, agents=(("alice", ()),))
    s.define_queue("sales", ["alice"], [], "longest_idle", 20)
    s.join("c1", "sales")
    s.claim("c1")
    s.ring_ended("c1", None, ["alice"], declined=["alice"])  # 486 Busy Here: no tight loop of INVITEs
    assert s.agent("alice").state == AgentState.AVAILABLE
    assert s.claim("c1") is None
    clock.t += RETRY_S + 0.1
    s.heartbeat()
    assert [a.name for a in s.claim("c1").agents] == ["alice"]


def test_a_callback_keeps_its_place_and_is_dialled_when_an_agent_frees_up(store_url):
    from callcenter.store.callbacks import DONE, FAILED_FOR_GOOD, WAITING, CallbackStore
    from callcenter.store.campaigns import CampaignStore

    clock = Clock()
    s = store(store_url, clock=clock, agents=(("alice", ()),))
    s.define_queue("sales", ["alice"], [], "longest_idle", 20)
    s.set_agent_state("alice", "pause", "meeting")
    callbacks = CallbackStore(s.db, clock=clock)
    CampaignStore(s.db, clock=clock).take_lease("dialer", "w1", 60)  # the fleet's dialer is alive
    s.join("c1", "sales")
    clock.t += 1
    s.join("c2", "sales")
    clock.t += 1
    s.leave("c1", "callback", ("+14155550199", "support", 2, 120.0))  # c1 pressed the callback key
    assert s.position("c2") == (2, 2), "the callback holds c1's place ahead of c2"
    assert callbacks.due() == [], "no agent is free yet"
    s.set_agent_state("alice", "resume")
    assert s.claim("c2") is None, "the free agent is the callback's"
    [cb] = callbacks.due()
    assert (cb.number, cb.flow, cb.queue, cb.state) == ("+14155550199", "support", "sales", WAITING)
    assert callbacks.claim(cb) == 1 and callbacks.claim(cb) is None  # one attempt, counted once
    assert s.claim("c2") is None, "still theirs while we dial"
    callbacks.placed(cb, "out-1")
    s.join("out-1", "sales")  # they answered: the call joins at c1's old place
    assert s.position("out-1") == (1, 2) and s.position("c2") == (2, 2)
    assert [a.name for a in s.claim("out-1").agents] == ["alice"]
    assert s.snapshot()[0][0].callbacks_pending == 1
    assert callbacks.finished("c1", "queue_answered") == DONE
    assert s.snapshot()[0][0].callbacks_pending == 0

    # unanswered: tried again after retry_s, until the attempts run out
    s.leave("c2", "abandoned")
    s.join("c3", "sales")
    s.leave("c3", "callback", ("+14155550100", "support", 2, 120.0))
    s.ring_ended("out-1", "alice", ["alice"])
    s.agent_call_ended("alice", "sales", 0, 30)
    [cb] = callbacks.due()
    callbacks.claim(cb)
    assert callbacks.finished("c3", "no_answer") == WAITING and callbacks.due() == []
    clock.t += 121
    [cb] = callbacks.due()
    callbacks.claim(cb)
    assert callbacks.finished("c3", "busy") == FAILED_FOR_GOOD and callbacks.get("c3").result == "busy"


def test_a_callback_does_not_hold_the_queue_when_no_dialer_is_alive(store_url):
    clock = Clock()
    s = store(store_url, clock=clock, agents=(("alice", ()),))
    s.define_queue("sales", ["alice"], [], "longest_idle", 20)
    s.join("c1", "sales")
    s.join("c2", "sales")
    s.leave("c1", "callback", ("+14155550199", "support", 3, 300.0))
    assert [a.name for a in s.claim("c2").agents] == ["alice"], "nobody would call c1 back: c2 is not held up"
