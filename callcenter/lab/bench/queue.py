"""`callcenter bench queue`: a contact center with real components, measured.

`serve --workers W` behind Kamailio (registrar and dispatcher), A baresip agent phones registered
with digest authentication, baresip callers. In order:

1. **Reference**: one scripted AI conversation per worker (the `bench call` lines on a billing
   flow), nobody queued: voice-to-voice per turn.
2. **With a queue**: the same conversations while 3 callers per worker wait in a queue (hold music,
   announcements, each looking for an agent every 0.2 s): the added voice-to-voice cost.
3. **Capacity**: `callers` callers queued across the workers at once (every call slot of 3 workers
   at 12) for `hold_s`: the workers' CPU per queued caller, frames late.
4. **Agent free → phone ringing**: the agents log in; each call they take lasts a few seconds and is
   followed by `wrap_up_s`; for every ring, the time from the agent becoming free (logging in, or
   the end of wrap-up) to the worker sending the INVITE, from the shared store's own log.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from callcenter.call.events import read_events
from callcenter.call.latency import turn_latencies
from callcenter.lab.bench.call import CALLER_LINES, _free_port, _media_summary, _pct, _wait_warmed, cpu_seconds
from callcenter.lab.fleet import Fleet
from callcenter.lab.fleet import control_request as _api
from callcenter.lab.softphone import Softphone, caller_audio, scripted_caller
from callcenter.store.db import open_database
from callcenter.voice.flite import flite_voice

WRAP_UP_S = 1.0
AGENT_PASSWORD = "bench-agent-{}"

FLOW = """
name: bench-queue
start: menu
queues:
  desk:
    agents: [{agents}]
    ring_timeout_s: 10
    wrap_up_s: {wrap}
    announce_every_s: 20
    max_wait_s: 600
nodes:
  menu:
    type: ask
    prompt: How can I help you today? Say billing, or ask for a person.
    timeout_s: 8
    max_attempts: 2
    on_failure: to_desk
    intents:
      billing:
        examples: [billing, my bill, a question about my bill]
        next: billing_answer
      person:
        examples: [a person, talk to a person, an agent, a human]
        next: to_desk
  billing_answer:
    type: ask
    prompt: Your latest bill is in your online account. Is there anything else?
    timeout_s: 8
    max_attempts: 1
    on_failure: bye
    intents:
      no:
        examples: [no thanks, that's all, no]
        next: bye
  to_desk:
    type: transfer
    queue: desk
    on_failure: bye
  bye:
    type: hangup
    text: Thank you for calling. Goodbye.
"""


def _waiting(url: str, token: str) -> int:
    queues = _api(url, token, "/api/queues")["queues"]
    return queues[0]["waiting"] if queues else 0


def _until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.3)
    return False


def ring_latencies(store: str, wrap_up_s: float) -> list[float]:
    """For each ring of an agent who had just become free while callers waited: ring time minus
    the moment they became free (login, or their last call's end plus wrap-up)."""
    db = open_database(store)
    try:
        rows = db.execute("SELECT t, agent, kind FROM queue_log WHERE kind IN ('agent_login', 'done', 'ring') "
                          "ORDER BY t")
    finally:
        db.close()
    free: dict[str, float] = {}
    out = []
    for t, agent, kind in rows:
        if kind == "agent_login":
            free[agent] = t
        elif kind == "done":
            free[agent] = t + wrap_up_s
        elif kind == "ring":
            for name in (agent or "").split(","):
                if name in free:
                    out.append(max(0.0, t - free.pop(name)))
    return out


def bench_queue(out: Path, workers: int = 3, callers: int = 12, agents: int = 3, hold_s: float = 20.0,
                stores: list[str] | None = None) -> dict:
    """The bench on the embedded store, then on each of `stores` (a postgresql:// URL), in one run:
    the same figures for each, side by side under `stores`."""
    runs = {"sqlite (embedded)": None, **{_shown(url): url for url in stores or []}}
    report: dict = {"benchmark": "queue", "workers": workers, "agents": agents, "callers": callers, "stores": {}}
    for name, url in runs.items():
        work = Path(tempfile.mkdtemp(prefix="callcenter-bench-queue-"))
        try:
            report["stores"][name] = _bench_queue_on(work, workers, callers, agents, hold_s, url)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return report


def _shown(url: str) -> str:
    from callcenter.store.url import StoreUrl

    return StoreUrl.parse(url).display


def _transactions(url: str | None) -> int | None:
    """Transactions the store has committed so far (PostgreSQL's own count; None for SQLite)."""
    if url is None:
        return None
    db = open_database(url)
    try:
        return int(db.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0][0])
    finally:
        db.close()


def _bench_queue_on(work: Path, workers: int, callers: int, agents: int, hold_s: float, store: str | None) -> dict:
    names = [f"agent{i}" for i in range(agents)]
    flow = work / "queue.yaml"
    flow.write_text(FLOW.format(agents=", ".join(names), wrap=WRAP_UP_S))
    balancer, control = _free_port(), _free_port()
    agents_yaml = "".join(f"    - {{name: {n}, logged_in: false}}\n" for n in names)
    fleet = Fleet(work / "fleet", flow, workers, _free_port(), balancer, rtp_port=30000,
                  extra_config=f"control: {{host: 127.0.0.1, port: {control}}}\n"
                               + (f"store: '{store}'\n" if store else "")
                               + f"contact_center:\n  registrar: 127.0.0.1:{balancer}\n  agents:\n{agents_yaml}",
                  agents={n: AGENT_PASSWORD.format(i) for i, n in enumerate(names)})
    ai_mic = scripted_caller(CALLER_LINES, work, lead_s=9.0, gap_s=9.0, tail_s=6.0)
    person = flite_voice("I would like to talk to a person please.", work / "person.wav")
    hello = flite_voice("Hello, this is the service desk. How can I help?", work / "desk.wav")
    phones: list[Softphone] = []
    report: dict = {}
    try:
        xact0 = _transactions(store)
        fleet.start()
        _wait_warmed(fleet, 120)
        url = f"http://127.0.0.1:{control}"
        token = (fleet.recordings / ".control-token").read_text().strip()
        pids = fleet.worker_pids()
        for i, n in enumerate(names):  # the whisper (~4 s), a greeting, then they hang up
            mic = caller_audio([hello], work / f"{n}.wav", lead_s=4.5, gap_s=0, tail_s=2.0)
            phone = Softphone(work / f"phone-{n}", mic, user=n, registrar=f"127.0.0.1:{balancer}",
                              password=AGENT_PASSWORD.format(i)).start()
            phones.append(phone)
            if not phone.wait_registered(10):
                raise RuntimeError(f"agent {n} did not register:\n{phone.log()[-2000:]}")

        def ai_calls(tag: str) -> list[dict]:
            def one(i: int) -> None:
                with Softphone(work / f"ai-{tag}-{i}", ai_mic) as phone:
                    phone.dial(fleet.uri)
                    phone.wait_established(10)
                    phone.wait_ended(90)
            before = set(fleet.calls())
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(one, range(workers)))
            time.sleep(1.0)
            turns = []
            for jsonl in set(fleet.calls()) - before:
                turns += turn_latencies(read_events(jsonl))
            return turns

        def queue_callers(n: int, tag: str) -> list[Softphone]:
            mic = caller_audio([person], work / f"q-{tag}.wav", lead_s=6.0, gap_s=0, tail_s=400)
            out = []
            for i in range(n):
                phone = Softphone(work / f"q-{tag}-{i}", mic, user=f"q{tag}{i}")
                phone.dial(fleet.uri)
                phones.append(phone)
                out.append(phone)
                time.sleep(0.3)
            return out

        # 1. reference
        ref = ai_calls("ref")
        # 2. the same conversations while 3 callers per worker wait
        waiting = queue_callers(3 * workers, "a")
        _until(lambda: _waiting(url, token) >= 3 * workers, 60)
        busy = ai_calls("busy")
        report["voice_to_voice"] = {
            "reference": _pct([t["voice_to_voice"] for t in ref]) if ref else None,
            "with_queued_callers": _pct([t["voice_to_voice"] for t in busy]) if busy else None,
            "queued_callers": 3 * workers}
        if ref and busy:
            report["voice_to_voice"]["added_p50_ms"] = round(
                report["voice_to_voice"]["with_queued_callers"]["p50_ms"] - report["voice_to_voice"]["reference"]["p50_ms"], 1)
        # 3. capacity: every slot a queued caller
        extra = queue_callers(max(0, callers - len(waiting)), "b")
        _until(lambda: _waiting(url, token) >= callers, 60)
        queued = _waiting(url, token)
        cpu0, t0 = sum(cpu_seconds(p) for p in pids), time.monotonic()
        time.sleep(hold_s)
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        wall = time.monotonic() - t0
        report["capacity"] = {"queued": queued, "hold_s": round(wall, 1), "workers_cores_busy": round(cpu / wall, 3),
                              "core_share_per_queued_caller": round(cpu / wall / max(1, queued), 4)}
        for phone in extra:  # free a slot per worker for the agents' legs
            phone.close()
        _until(lambda: _waiting(url, token) <= len(waiting), 20)
        # 4. agents log in and take the waiting callers
        for n in names:
            _api(url, token, f"/api/agents/{n}/login", {})
            time.sleep(0.5)
        served = _until(lambda: _api(url, token, "/api/queues")["queues"][0]["answered_today"] >= len(waiting), 240)
        time.sleep(8)
        lat = ring_latencies(fleet.store, WRAP_UP_S)
        report["agent_free_to_ring"] = {**_pct(lat), "max_ms": round(max(lat) * 1000, 1)} if lat else None
        report["answered"] = _api(url, token, "/api/queues")["queues"][0]["answered_today"]
        report["all_served"] = served
    finally:
        for phone in phones:
            phone.close()
        fleet.stop()
    every = [e for jsonl in fleet.calls() for e in read_events(jsonl)]
    report["media"] = _media_summary(every)
    calls = len(fleet.calls())
    xact = _transactions(store)
    report["store_transactions_per_call"] = round((xact - xact0) / calls, 1) if xact is not None and calls else None
    report["note"] = ("agent_free_to_ring: from the agent becoming free (login, or the end of wrap-up) to the "
                      "worker sending the INVITE (the shared store's log; the INVITE then crosses Kamailio on "
                      "loopback). voice_to_voice: the AI turns of one scripted caller per worker, alone and "
                      "with 3 callers per worker in the queue, same run. capacity: the workers' CPU while "
                      "`queued` callers hear hold music and announcements. store_transactions_per_call: the "
                      "store's committed transactions (PostgreSQL's own count, heartbeats and queue polls "
                      "included) over the calls of the run.")
    return report
