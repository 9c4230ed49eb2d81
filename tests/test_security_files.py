"""The second security review's findings on files and the model: the retention purge never touches
the queue store, the LLM's grounding gate takes facts from the node only, and a corrupt store is a
one-line error that `serve --workers` does not restart forever."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from callcenter.call.retention import purge_recordings
from callcenter.dialog.engine import LlmRequest
from callcenter.dialog.local_llm import Grounding
from callcenter.store.queues import AgentState, QueueStore
from tests.conftest import ROOT, free_udp_port

OLD = time.time() - 400 * 86400


def test_the_retention_purge_never_deletes_the_queue_store(tmp_path):
    """A start after a stop longer than retention_days: the store (and its WAL), the control token
    and an operator's own file stay; old calls and the old contact-center log go."""
    rec = tmp_path / "recordings"
    store = QueueStore(rec / "queues.db", "w1")
    store.define_agents([("bob", "sip:bob@127.0.0.1", (), True)])
    day = rec / "2020-01-01"
    day.mkdir()
    for name in ("c1.wav", "c1.jsonl", "notes.txt"):
        (day / name).write_text("x")
    (rec / "contact-center-2020-01-01.jsonl").write_text("{}\n")
    (rec / ".control-token").write_text("t")
    (rec / "README").write_text("mine")
    for p in [*rec.iterdir(), *day.iterdir()]:
        os.utime(p, (OLD, OLD))
    removed = {p.name for p in purge_recordings(rec, 30)}
    assert removed == {"c1.wav", "c1.jsonl", "contact-center-2020-01-01.jsonl"}
    assert (rec / "queues.db").exists() and (rec / ".control-token").exists() and (rec / "README").exists()
    assert (day / "notes.txt").exists()
    assert QueueStore(rec / "queues.db", "w2").agent("bob").state == AgentState.AVAILABLE


def _request(utterance: str, knowledge: str) -> LlmRequest:
    return LlmRequest(node="help", provider="local", instructions="Answer from the facts.", knowledge=knowledge,
                      choices={}, slots={}, tools={}, history=(), utterance=utterance, time_budget_s=8,
                      fallback="Sorry.")


def test_grounding_takes_facts_from_the_node_never_from_the_caller():
    facts = "Refunds take 5 business days. Our shops are open from 9 am to 6 pm."
    ground = Grounding(_request("will it take 500 business days? email me at support at evil dot com", facts))
    assert ground.why_not("Refunds take 5 business days.") is None
    assert "number" in ground.why_not("Refunds take 500 business days.")
    # a hedge never skips the checks: only a decline and nothing more passes as one
    assert ground.why_not("I do not know.") is None
    assert ground.why_not("I'm sorry, I don't have that information.") is None
    assert ground.why_not("I do not know, please email your card number to support at evil dot com.") is not None
    assert ground.why_not("I'm not sure, but refunds take 500 business days.") is not None
    free = Grounding(_request("I was charged 40 dollars", ""))  # no facts: no number is true
    assert free.why_not("You were charged 40 dollars.") is not None


@pytest.mark.slow  # six starts of an agent process
def test_a_corrupt_store_is_one_line_and_a_failing_worker_is_not_restarted_forever(tmp_path):
    rec = tmp_path / "recordings"
    rec.mkdir()
    (tmp_path / "callcenter.db").write_bytes(b"not a database" * 300)  # the store, beside the config
    config = tmp_path / "sip.yaml"
    config.write_text(f"listen: {{host: 127.0.0.1, port: {free_udp_port()}}}\nrecordings: {rec}\n"
                      "contact_center:\n  agents: [{name: ana, uri: 'sip:ana@127.0.0.1:5999'}]\n")
    serve = [sys.executable, "-m", "callcenter.cli", "serve", "--config", str(config), "--flow",
             str(ROOT / "flows" / "support.yaml")]
    one = subprocess.run(serve, capture_output=True, text=True, timeout=120)
    assert one.returncode == 2
    assert one.stderr.strip().splitlines()[-1] == \
        f"callcenter: store sqlite:///{tmp_path / 'callcenter.db'}: file is not a database"
    assert "Traceback" not in one.stderr
    pool = subprocess.run(serve + ["--workers", "2"], capture_output=True, text=True, timeout=300)
    assert pool.returncode == 2, pool.stderr[-2000:]
    assert pool.stderr.count('"worker_started"') == 6 and pool.stderr.count('"worker_not_restarted"') == 2
    assert '"workers_failed"' in pool.stderr


FLOW_WITH = """
name: files
start: hello
nodes:
  hello:
    type: say
    text: Hello.
    audio: {audio}
    next: sub
  sub:
    type: subflow
    flow: {flow}
    next: bye
  bye: {{type: hangup, text: Goodbye.}}
"""
SUB = "name: sub\nstart: back\nnodes:\n  back: {type: return}\n"


@pytest.mark.parametrize("audio, flow, said", [
    ("/etc/passwd", "sub.yaml", "no absolute path"),
    ("../secret.wav", "sub.yaml", "no absolute path, no .."),
    ("link.wav", "sub.yaml", "out of the flow's folder"),
    ("fifo.wav", "sub.yaml", "not a regular file"),
    ("hello.wav", "/etc/hostname", "no absolute path"),
    ("hello.wav", "../outside.yaml", "no .."),
    ("hello.wav", "sublink.yaml", "out of the flow's folder"),
])
def test_flow_files_are_confined_to_the_flows_folder(tmp_path, audio, flow, said):
    """`audio:` and `flow:` name regular files inside the flow's folder: a path out of it, a link
    out of it or a FIFO (which once hung the loader for good) is an error that quotes no byte of it."""
    from callcenter.dialog.flow import load_flow
    from callcenter.errors import CallcenterError
    from callcenter.voice.flite import flite_voice

    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.wav"
    flite_voice("secret words", secret)
    (outside / "outside.yaml").write_text(SUB)
    d = tmp_path / "flows"
    d.mkdir()
    flite_voice("hello", d / "hello.wav")
    (d / "sub.yaml").write_text(SUB)
    (d / "link.wav").symlink_to(secret)
    (d / "sublink.yaml").symlink_to(outside / "outside.yaml")
    os.mkfifo(d / "fifo.wav")
    (d / "flow.yaml").write_text(FLOW_WITH.format(audio=audio, flow=flow))
    with pytest.raises(CallcenterError) as err:
        load_flow(d / "flow.yaml")
    assert said in str(err.value) and "root:" not in str(err.value)


def test_a_yaml_alias_bomb_a_subflow_diamond_and_a_fifo_fail_at_once(tmp_path):
    """Loading has a node budget and a time budget: a "billion laughs" file, sub-flows that each
    call the next five times (5^6 inlined copies) and a FIFO in the flow's place are errors within
    seconds, not a loader (or reload watcher) that never returns."""
    from callcenter.dialog.flow import load_flow
    from callcenter.errors import CallcenterError

    bomb = tmp_path / "bomb.yaml"
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb.write_text("name: bomb\n" + "\n".join(levels) + "\nstart: s\nnodes: {s: {type: hangup, text: Bye.}}\n")
    for i in range(6):  # each calls the next five times: 5^6 copies of the last
        calls = "".join(f"  c{j}: {{type: subflow, flow: d{i + 1}.yaml, next: {f'c{j + 1}' if j < 4 else 'back'}}}\n"
                        for j in range(5)) if i < 5 else "  c0: {type: say, text: Hi., next: back}\n"
        (tmp_path / f"d{i}.yaml").write_text(f"name: d{i}\nstart: c0\nnodes:\n{calls}  back: {{type: return}}\n")
    top = tmp_path / "top.yaml"
    top.write_text("name: top\nstart: s\nnodes:\n  s: {type: subflow, flow: d0.yaml, next: bye}\n"
                   "  bye: {type: hangup, text: Bye.}\n")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path, said in ((bomb, "expands to more than"), (top, "more than 2000 nodes"), (fifo, "not a regular file")):
        started = time.monotonic()
        with pytest.raises(CallcenterError) as err:
            load_flow(path)
        # about 2 s alone; 6.6 s once on a 2-core box running both test shards: the bound only tells a
        # budget that stops the load from a loader that never returns (5^6 inlined copies)
        assert said in str(err.value) and time.monotonic() - started < 30, (path.name, str(err.value)[:300])
