import itertools
import os
import shutil
import socket
from pathlib import Path

import pytest

from callcenter.voice.flite import flite_voice

ROOT = Path(__file__).resolve().parent.parent
FLOW = ROOT / "flows" / "support.yaml"
SHARED_EVAL = ROOT.parent / "shared" / "eval"

_ports = itertools.count(0)

# `kind: local` turns into the hybrid (embeddings, then the offline model) on a machine where
# `callcenter llm build` has run; the suite pins the embedding path so that it tests the same thing
# everywhere. tests/test_local_llm.py builds the hybrid itself.
os.environ.setdefault("CALLCENTER_LLM", "off")


# Ports for agents, softphones and servers the tests start: below the kernel's ephemeral range
# (32768-60999 here), where a socket opened anywhere else on the machine is never given one at
# random between our choosing a port and the process binding it (a port bound to 0 and closed again
# was taken by another process in that gap, and the agent failed "Address already in use"). Each
# call hands out the first of a block of PORT_BLOCK ports, all free (a pool of workers listens on
# port, port + 1, ...), and a block comes round again only after the whole range; the two shards of
# ./scripts/test have ranges of their own.
PORT_RANGES = {("udp", "line"): 10000, ("udp", "offline"): 12000, ("tcp", "line"): 14000, ("tcp", "offline"): 16000}
PORTS_PER_RANGE = 2000
PORT_BLOCK = 8
_handed = {"udp": itertools.count(0), "tcp": itertools.count(0)}


def _bindable(kind: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:  # held by something outside this run
            return False
    return True


def _free_port(kind: str) -> int:
    shard = port_shard()  # as rtp_base() reads it
    first = PORT_RANGES[(kind, shard)]
    blocks = PORTS_PER_RANGE // PORT_BLOCK
    for _ in range(blocks):
        port = first + (next(_handed[kind]) % blocks) * PORT_BLOCK
        if all(_bindable(kind, port + i) for i in range(PORT_BLOCK)):
            return port
    raise RuntimeError(f"no free block of {kind} ports in {first}-{first + PORTS_PER_RANGE - 1}")


def free_udp_port() -> int:
    return _free_port("udp")


def free_tcp_port() -> int:
    return _free_port("tcp")


def wait_for(predicate, timeout: float) -> bool:
    """Poll `predicate` every 0.2 s until it holds (True) or `timeout` passes (False)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


CONTROL_TOKEN = "test-control-token-0c1"


def scrape(agent) -> dict[str, dict[tuple, float]]:
    """GET /metrics as Prometheus would, parsed by prometheus_client's own parser: metric name →
    {sorted label items: value} (histograms as name_bucket, name_count, name_sum)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    req = urllib.request.Request(agent.control_url + "/metrics", headers={"Authorization": f"Bearer {CONTROL_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


# `./scripts/test` runs the suite as two pytest processes at once (CALLCENTER_TEST_SHARD): `line`
# holds the tests that place calls in real time (marked sip or slow), one at a time; `offline` holds
# the rest, CPU work on a clock of its own (the quick tier, the slow files below and tests marked
# no_deadline: real servers, but no audio judged on a deadline), on one thread.
SHARD_ENV = "CALLCENTER_TEST_SHARD"
OFFLINE_SLOW_FILES = {"test_voice_clone.py", "test_outbound_dial.py", "test_simulate.py", "test_cli.py", "test_scenarios.py", "test_security_files.py",
                      "test_local_llm.py", "test_stt_weights.py", "test_voice_derive.py", "test_supervisor_release.py", "test_hear_back.py",
                      # raw SIP signalling, no audio on a deadline
                      "test_security_agents.py", "test_store_kamailio.py", "test_workers.py"}


def on_the_line(item) -> bool:
    return bool(item.get_closest_marker("sip") or item.get_closest_marker("slow")) \
        and item.path.name not in OFFLINE_SLOW_FILES and not item.get_closest_marker("no_deadline")


QUICK_SHARDS = ("quick-a", "quick-b")  # the quick tier in two processes: every other test each


def port_shard() -> str:
    """Which port ranges this process takes: two processes at once never share one."""
    return "offline" if os.environ.get(SHARD_ENV) in ("offline", QUICK_SHARDS[1]) else "line"


def pytest_collection_modifyitems(config, items):
    shard = os.environ.get(SHARD_ENV)
    if shard not in ("line", "offline", *QUICK_SHARDS):
        return
    keep, drop = [], []
    for i, item in enumerate(items):
        if shard in QUICK_SHARDS:
            mine = i % 2 == QUICK_SHARDS.index(shard)
        else:
            mine = on_the_line(item) == (shard == "line")
        (keep if mine else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def rtp_base() -> int:
    """A distinct RTP port range per agent started in this test run (and per shard)."""
    first = 35000 if port_shard() == "offline" else 20000
    return first + 1000 * (next(_ports) % 15)


@pytest.fixture(scope="session")
def caller_voice(tmp_path_factory):
    d = tmp_path_factory.mktemp("caller")

    def make(name: str, text: str) -> Path:
        path = d / f"{name}.wav"
        if not path.exists():
            if not shutil.which("flite"):
                pytest.skip("flite is not installed")
            flite_voice(text, path)
        return path

    return make


@pytest.fixture(scope="session")
def stt():
    from callcenter.hearing.stt import WhisperStt

    return WhisperStt()


@pytest.fixture(scope="session")
def tts():
    from callcenter.voice.speaker import make_tts

    return make_tts()  # the default voice, ssm:heart; flows pick others per node


@pytest.fixture(scope="session")
def flow():
    from callcenter.dialog.flow import load_flow

    return load_flow(FLOW)


@pytest.fixture
def agent(tmp_path):
    from callcenter.lab.agent_process import AgentProcess

    # memory trimmed every 2 s (not 60) so that the SIP tests run it between and during calls; the
    # control API on so that they can scrape /metrics
    proc = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                        token=CONTROL_TOKEN, extra_config="memory_trim_s: 2\n").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server for the test session (tests/pg.py)."""
    from tests.pg import Postgres, pg_bin

    if pg_bin() is None:
        pytest.skip("PostgreSQL is not installed (scripts/setup installs it)")
    server = Postgres(free_tcp_port()).start()
    yield server
    server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A fresh, empty store on each back end: an SQLite file, or a database on the session's server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgres_server").new_database()
