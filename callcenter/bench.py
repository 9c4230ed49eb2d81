"""`callcenter bench call`: scripted calls through the real SIP path (baresip → pjsua2 agent) and the
per-stage latency of every caller turn, from the agent's own event stamps.

Per turn: end of caller speech (last voiced frame) → endpoint decision (speech_end) → STT final →
flow decision → TTS first audio → first RTP frame out (voice-to-voice).
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from callcenter.call.events import read_events
from callcenter.server import AgentProcess
from callcenter.telephony.softphone import Softphone, scripted_caller

CALLER_LINES = ("I have a question about my bill", "No thanks, that's all")
STAGES = ("endpoint", "stt", "flow", "wait", "tts", "transport")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def turn_latencies(events: list[dict]) -> list[dict]:
    """Stage-by-stage latency (seconds) of each spoken caller turn that the agent answered."""
    turns: dict[int, dict] = {}
    for e in events:
        t = turns.setdefault(e["turn"], {})
        if e["kind"] not in t:
            t[e["kind"]] = e
    out = []
    for n, t in sorted(turns.items()):
        need = ("speech_end", "stt_final", "flow_decision", "tts_first_audio", "first_rtp_out")
        if n == 0 or not all(k in t for k in need):
            continue
        end = t["speech_end"]
        voice_end = end.get("last_voice_t", end["t"])
        out.append({
            "turn": n,
            "endpoint": end["t"] - voice_end,
            "stt": t["stt_final"]["t"] - end["t"],
            "flow": t["flow_decision"]["t"] - t["stt_final"]["t"],
            # webhook or model time before the first words (0 for scripted nodes)
            "wait": t["agent_say"]["t"] - t["flow_decision"]["t"] if "agent_say" in t else 0.0,
            "tts": t["tts_first_audio"]["t"] - t.get("agent_say", t["flow_decision"])["t"],
            "transport": t["first_rtp_out"]["t"] - t["tts_first_audio"]["t"],
            "after_endpoint": t["first_rtp_out"]["t"] - end["t"],
            "voice_to_voice": t["first_rtp_out"]["t"] - voice_end,
        })
    return out


def _pct(xs: list[float]) -> dict:
    a = np.array(xs) * 1000
    return {"p50_ms": round(float(np.percentile(a, 50)), 1), "p95_ms": round(float(np.percentile(a, 95)), 1),
            "n": len(xs)}


def bench_call(calls: int, flow: str, out: Path, concurrent: int = 1) -> dict:
    """Runs its own agent (`callcenter serve`) on a free loopback port and calls it with baresip."""
    work = Path(tempfile.mkdtemp(prefix="callcenter-bench-"))
    # caller speaks after the greeting and menu prompt, and again after the answer
    mic = scripted_caller(CALLER_LINES, work, lead_s=13.0, gap_s=11.0, tail_s=6.0)
    agent = AgentProcess(work / "agent", _free_port(), 30000, flow).start()

    def one(i: int) -> None:
        with Softphone(work / f"phone{i}", mic) as phone:
            phone.dial(agent.uri)
            phone.wait_established(10)
            phone.wait_ended(90)

    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(max(1, concurrent)) as pool:
            list(pool.map(one, range(calls)))
        time.sleep(1.0)
    finally:
        agent.stop()
    per_call = []
    all_turns = []
    for jsonl in agent.calls():
        events = read_events(jsonl)
        turns = turn_latencies(events)
        all_turns += turns
        per_call.append({"call_id": events[0]["call_id"] if events else jsonl.stem, "turns": turns,
                         "transcript": [(e["kind"], e.get("text")) for e in events if e["kind"] in ("stt_final", "agent_say")]})
    summary = {
        "calls": len(per_call),
        "turns": len(all_turns),
        "concurrent": concurrent,
        "wall_s": round(time.monotonic() - t0, 1),
        **{k: _pct([t[k] for t in all_turns]) for k in (*STAGES, "after_endpoint", "voice_to_voice") if all_turns},
    }
    report = {"benchmark": "call", "summary": summary, "calls": per_call,
              "note": "voice_to_voice = first RTP frame out - last voiced caller frame; it includes the "
                      "endpointing silence (the flow node's end_silence_ms)."}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return report
