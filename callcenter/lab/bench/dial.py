"""`callcenter bench dial`: calls placed through the control API at a steady rate, and what they cost
the inbound calls of the same agent.

One `callcenter serve` (one process, its call slots shared by both directions) with an outbound flow
that says one sentence and hangs up (machine detection off: the far end is sipp, not a person):

1. **Throughput.** `POST /api/dial` at `rate` calls a second for `seconds`, to a sipp UAS that
   answers every call at once. Reported: dials asked, placed, refused for want of a free call slot
   (503), answered, calls a second sustained (ended ÷ wall time), and the time from the request to
   the answer (p50, p95).
2. **Inbound reply time while dialling.** `inbound` scripted baresip callers (the `bench call`
   lines, on `flows/support.yaml`), one at a time, first alone, then again while dials go on at
   `rate`: voice-to-voice p50 and p95 of each, and their ratio. The dials never take the inbound
   caller's slot: they are refused (503) when the slots are full, and counted."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
from pathlib import Path

from callcenter.call.events import read_events
from callcenter.call.latency import turn_latencies
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.bench.call import CALLER_LINES, _free_port, _free_tcp_port, _pct, _wait_warmed
from callcenter.lab.bench.report import provenance
from callcenter.lab.fleet import control_request
from callcenter.lab.softphone import Softphone, scripted_caller

TOKEN = "bench-dial-token"
PING_FLOW = """
name: ping
machine_detection: false
start: bye
nodes:
  bye:
    type: hangup
    text: Hello, this is a test call from Example Dental. Goodbye.
"""


class Dialling:
    """Dials at `rate` a second in a thread until stopped; each dial's fate."""

    def __init__(self, agent: AgentProcess, to: str, rate: float):
        self.agent, self.to, self.rate = agent, to, rate
        self.asked = self.refused = self.failed = 0
        self.placed: list[tuple[str, float]] = []  # (call id, when asked)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Dialling":
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return time.monotonic() - self.t0

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            due = self.t0 + n / self.rate
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            n += 1
            self.asked += 1
            asked = time.monotonic()
            try:
                reply = control_request(self.agent.control_url, TOKEN, "/api/dial", {"to": self.to, "flow": "ping"})
                self.placed.append((reply["call_id"], asked))
            except urllib.error.HTTPError as exc:
                if exc.code == 503:
                    self.refused += 1
                else:
                    self.failed += 1


def _outcomes(agent: AgentProcess, placed: list[tuple[str, float]], wait_s: float = 20.0) -> dict:
    """How the placed dials ended, from the API, and request → answer from their events."""
    deadline = time.monotonic() + wait_s
    states = {}
    for call_id, _ in placed:
        while True:
            s = control_request(agent.control_url, TOKEN, f"/api/dial/{call_id}")
            if s["state"] == "ended" or time.monotonic() > deadline:
                states[call_id] = s
                break
            time.sleep(0.2)
    answered = {c for c, s in states.items() if s.get("outcome") not in (None, "no_answer", "busy", "failed")}
    to_answer = []
    for call_id, _ in placed:
        for path in agent.recordings.glob(f"*/{call_id}.jsonl"):
            events = read_events(path)
            start = next((e for e in events if e["kind"] == "call_start"), None)
            if start is not None and call_id in answered:
                to_answer.append(start["wall"] - states[call_id]["started"])
    return {"answered": len(answered), "outcomes": sorted({str(s.get("outcome")) for s in states.values()}),
            **({"dial_to_answer": _pct(to_answer)} if to_answer else {})}


def _inbound(agent: AgentProcess, work: Path, mic: Path, calls: int, tag: str) -> list[dict]:
    turns = []
    before = set(agent.calls())
    for i in range(calls):
        with Softphone(work / f"{tag}{i}", mic) as phone:
            phone.dial(agent.uri)
            phone.wait_established(10)
            phone.wait_ended(90)
    time.sleep(1.0)
    for path in sorted(set(agent.calls()) - before):
        events = read_events(path)
        if any(e["kind"] == "call_start" and e.get("direction") == "inbound" for e in events):
            turns += turn_latencies(events)
    return turns


def bench_dial(out: Path, rate: float = 0.5, seconds: float = 60.0, inbound: int = 2) -> dict:
    if not shutil.which("sipp"):
        raise RuntimeError("bench dial needs sipp (apt-get install sip-tester)")
    work = Path(tempfile.mkdtemp(prefix="bench-dial-"))
    sipp_port = _free_port()
    sipp = subprocess.Popen(["sipp", "-sn", "uas", "-i", "127.0.0.1", "-p", str(sipp_port), "-nostdin",
                             "-timeout", "3600s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
    flow = work / "ping.yaml"
    flow.write_text(PING_FLOW)
    agent = AgentProcess(work / "agent", _free_port(), 37000, "flows/support.yaml", max_calls=4,
                         control_port=_free_tcp_port(), token=TOKEN,
                         extra_config=f"outbound:\n  flows: {{ping: {flow}}}\n  allow: ['sip:*@127.0.0.1:*']\n"
                                      f"  ring_s: 10\n").start()
    mic = scripted_caller(CALLER_LINES, work, lead_s=13.0, gap_s=11.0, tail_s=6.0)
    to = f"sip:bench@127.0.0.1:{sipp_port}"
    try:
        _wait_warmed(agent)
        # 1. throughput alone
        dialling = Dialling(agent, to, rate).start()
        time.sleep(seconds)
        wall = dialling.stop()
        alone = _outcomes(agent, dialling.placed)
        throughput = {"rate_asked": rate, "seconds": round(wall, 1), "asked": dialling.asked,
                      "placed": len(dialling.placed), "refused_no_slot": dialling.refused, "failed": dialling.failed,
                      **alone, "calls_per_second": round(alone["answered"] / wall, 3)}
        time.sleep(8.0)  # the last dials end
        # 2. inbound reply time, alone and while dialling
        reference = _inbound(agent, work, mic, inbound, "alone")
        dialling = Dialling(agent, to, rate).start()
        loaded = _inbound(agent, work, mic, inbound, "dialling")
        wall = dialling.stop()
        during = _outcomes(agent, dialling.placed)
    finally:
        agent.stop()
        sipp.terminate()
        sipp.wait(5)
    ref_v2v, load_v2v = [t["voice_to_voice"] for t in reference], [t["voice_to_voice"] for t in loaded]
    report = {
        "benchmark": "dial: calls placed through the control API, and inbound reply time while they go on",
        **provenance(),
        "made_by": f"callcenter bench dial --rate {rate} --seconds {seconds:g} --inbound {inbound} --json {out}",
        "note": "One serve process (4 call slots) dials a sipp UAS through POST /api/dial at the asked rate; its "
                "flow says one sentence and hangs up. Inbound: scripted baresip callers on flows/support.yaml, one "
                "at a time, alone and then while dials go on (their turns' voice-to-voice).",
        "throughput": throughput,
        "inbound": {"alone": _pct(ref_v2v) if ref_v2v else None,
                    "while_dialling": _pct(load_v2v) if load_v2v else None,
                    "p50_ratio": round(_pct(load_v2v)["p50_ms"] / _pct(ref_v2v)["p50_ms"], 3)
                    if ref_v2v and load_v2v else None,
                    "dials_meanwhile": len(dialling.placed), "dials_answered_meanwhile": during["answered"],
                    "dial_seconds": round(wall, 1)},
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return report
