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
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from callcenter.call.bridge import SOUND_DBFS
from callcenter.call.events import read_events
from callcenter.call.latency import STAGES, turn_latencies
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.softphone import Softphone, scripted_caller
from callcenter.memory import TRIM_EVERY_S, open_fds, rss_mb
from callcenter.voice.speaker import PROMPT_CACHE_MB

CALLER_LINES = ("I have a question about my bill", "No thanks, that's all")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float]) -> dict:
    a = np.array(xs) * 1000
    return {"p50_ms": round(float(np.percentile(a, 50)), 1), "p95_ms": round(float(np.percentile(a, 95)), 1),
            "n": len(xs)}


def _to_sound(turns: list[dict]) -> dict:
    """voice_to_sound: to the reply's first frame with sound in it (what the caller hears), beside
    voice_to_voice (to its first frame)."""
    heard = [t["voice_to_sound"] for t in turns if "voice_to_sound" in t]
    return {"voice_to_sound": _pct(heard)} if heard else {}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_summary(cpu_s: float, wall_s: float, concurrent: int) -> dict:
    return {"agent_cpu_s": round(cpu_s, 2), "agent_cores_busy": round(cpu_s / wall_s, 3),
            "core_share_per_call": round(cpu_s / wall_s / max(1, concurrent), 3)}


FAULT_KINDS = ("stage_slow", "stage_fallback", "trouble", "error")


def _faults(events: list[dict]) -> dict:
    """How often the agent had to cover for a slow or failed stage (see call/session.py)."""
    out = {k: 0 for k in FAULT_KINDS}
    for e in events:
        if e["kind"] in out:
            out[e["kind"]] += 1
    return out


def _write_report(out: Path, report: dict, work: Path) -> dict:
    """Write the JSON report and remove the benchmark's scratch folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return report


def _media_summary(events: list[dict]) -> dict:
    """Frames sent and late over calls, from each call's `media` event."""
    media = [e for e in events if e["kind"] == "media"]
    sent = sum(m.get("frames_out", 0) for m in media)
    late = sum(m.get("late_frames", 0) for m in media)
    return {"frames_sent": sent, "late_frames": late, "late_ratio": round(late / sent, 4) if sent else None,
            "worst_late_ms": max((m.get("worst_late_ms", 0) for m in media), default=None)}


def _wait_warmed(agent, timeout: float = 60) -> None:
    """Measure the agents (an AgentProcess or a Fleet) as they run all day: with the flow's fixed
    prompts already synthesised."""
    deadline = time.monotonic() + timeout
    while not agent.warmed() and time.monotonic() < deadline:
        time.sleep(0.2)


def _llm_paths(events: list[dict]) -> dict:
    """llm-node turns by the path that answered (the offline hybrid's `via`; `provider` otherwise)."""
    return dict(Counter(e.get("via") or "provider" for e in events if e["kind"] == "llm_reply"))


def _acknowledgements(flow: str) -> set[str]:
    from callcenter.dialog.flow import LlmNode, load_flow

    return {a.strip() for n in load_flow(Path(flow)).nodes.values() if isinstance(n, LlmNode) for a in n.acknowledgements}


def _with_llm_paths(turns: list[dict], events: list[dict], acks: set[str]) -> list[dict]:
    """Each turn an llm node answered gets its path (`via`: embedding, model, unsure, busy, slow...)
    and `model_words`: from the caller's last voiced frame to the first words after the node's
    acknowledgement (the model's own, or the embedding path's when it fell back)."""
    for turn in turns:
        mine = [e for e in events if e.get("turn") == turn["turn"]]
        reply = next((e for e in mine if e["kind"] == "llm_reply"), None)
        if reply is None:
            continue
        turn["via"] = reply.get("via") or "provider"
        end = next(e for e in mine if e["kind"] == "speech_end")
        voice_end = end.get("last_voice_t", end["t"])
        says = [e for e in mine if e["kind"] == "agent_say"]
        words = next((e for e in says if (e.get("text") or "").strip() not in acks), None)
        turn["acknowledged"] = bool(says) and (says[0].get("text") or "").strip() in acks
        if words is not None:
            turn["model_words"] = words["t"] - voice_end
    return turns


def _model_turns(turns: list[dict]) -> dict:
    """Voice-to-voice of the turns the offline model took (all paths but the clear embedding one)."""
    took = [t for t in turns if t.get("via") not in (None, "embedding", "provider")]
    if not took:
        return {}
    return {"model_turns": {"n": len(took), "voice_to_voice": _pct([t["voice_to_voice"] for t in took]),
                            "acknowledged": sum(t["acknowledged"] for t in took),
                            "words_after_acknowledgement": _pct([t["model_words"] for t in took if "model_words" in t])
                            if any("model_words" in t for t in took) else None}}


def bench_call(calls: int, flow: str, out: Path, concurrent: int = 1, workers: int = 0,
               prompt_cache_mb: int | None = None, stagger_s: float = 0.0,
               lines: tuple[str, ...] = CALLER_LINES, lead_s: float = 13.0, references: bool = False) -> dict:
    """Runs its own agent (`callcenter serve`) on a free loopback port and calls it with baresip;
    with `workers`, `serve --workers N` behind Kamailio, and the callers dial the balancer.
    `prompt_cache_mb` overrides the agents' prompt cache (0: every call synthesises every sentence).
    `stagger_s`: the first `concurrent` calls start this far apart (0: all at once, so every caller
    speaks at the same instant, a harder burst than callers arriving on their own).
    `lines`: what every caller says, `lead_s` into the call (after the greeting and first prompt),
    then 11 s apart. `references`: the same calls again against two agents of the same flow whose
    llm nodes answer without the offline model: the embedding path alone (`CALLCENTER_LLM=off`) and
    a remote provider (`kind: openai`) pointed at a loopback stub that answers at once
    (`lab/llm_stub.py`): the summary's `references` hold their llm-node turns."""
    if references and workers:
        raise ValueError("references are measured on one agent (leave out --workers)")
    work = Path(tempfile.mkdtemp(prefix="callcenter-bench-"))
    mic = scripted_caller(lines, work, lead_s=lead_s, gap_s=11.0, tail_s=6.0)
    run = dict(calls=calls, concurrent=concurrent, workers=workers, prompt_cache_mb=prompt_cache_mb,
               stagger_s=stagger_s, mic=mic)
    summary, per_call = _measure(work / "main", flow, **run)
    if references:
        from callcenter.lab.llm_stub import LlmStub

        summary["references"] = {"embedding": _llm_turns(*_measure(work / "embedding", flow, **run,
                                                                   env={"CALLCENTER_LLM": "off"}))}
        with LlmStub() as stub:
            remote = _remote_flow(Path(flow), work / "remote-flow", stub.url)
            summary["references"]["remote_stub"] = {**_llm_turns(*_measure(work / "remote", str(remote), **run)),
                                                    "stub_requests": stub.requests}
    report = {"benchmark": "call", "summary": summary, "calls": per_call,
              "note": "voice_to_voice = first RTP frame out - last voiced caller frame; voice_to_sound = the "
                      f"same to the reply's first frame over {SOUND_DBFS:g} dBFS (what the caller hears); both include the "
                      "endpointing silence (the flow node's end_silence_ms, or less where the turn detector "
                      "ended the turn early: speech_end's `why`). late = a frame the transport "
                      "asked for more than 20 ms after its tick. Turns missing from 'turns' (2 per call) "
                      "were not answered in time. references: the same calls, llm nodes answered by the "
                      "embedding path alone, and by a remote-protocol stub that answers at once."}
    return _write_report(out, report, work)


def _remote_flow(flow: Path, folder: Path, base_url: str) -> Path:
    """A copy of `flow` (and the files beside it, for sub-flows and recorded prompts) whose every llm
    provider is the OpenAI-compatible stub at `base_url`."""
    import yaml

    from callcenter.yamlfile import YamlLoader

    shutil.copytree(flow.parent, folder)
    path = folder / flow.name
    doc = yaml.load(path.read_text(), Loader=YamlLoader)  # the flows' own reading: "yes" stays a word
    providers = doc.get("llm") or {}
    doc["llm"] = {name: {"kind": "openai", "base_url": base_url, "model": "stub"} for name in {"default", *providers}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _llm_turns(summary: dict, per_call: list[dict]) -> dict:
    """A reference run's llm-node turns: how they ended and their voice-to-voice."""
    turns = [t for c in per_call for t in c["turns"] if t.get("via")]
    return {"llm_paths": summary["llm_paths"], "late_ratio": summary["late_ratio"],
            **({"llm_turns": {"n": len(turns), "endpoint": _pct([t["endpoint"] for t in turns]),
                              "voice_to_voice": _pct([t["voice_to_voice"] for t in turns])}} if turns else {})}


def _measure(work: Path, flow: str, calls: int, concurrent: int, workers: int, prompt_cache_mb: int | None,
             stagger_s: float, mic: Path, env: dict[str, str] | None = None) -> tuple[dict, list[dict]]:
    """One set of calls against a fresh agent: the summary and each call's turns."""
    from callcenter.lab.fleet import Fleet

    extra = f"prompt_cache_mb: {prompt_cache_mb}\n" if prompt_cache_mb is not None else ""
    if workers:
        agent = Fleet(work / "fleet", flow, workers, _free_port(), _free_port(), rtp_port=30000,
                      extra_config=extra).start()
        pids = agent.worker_pids()
    else:
        agent = AgentProcess(work / "agent", _free_port(), 30000, flow, extra_config=extra, env=env).start()
        pids = [agent.proc.pid]
    if prompt_cache_mb != 0:
        _wait_warmed(agent)

    def one(i: int) -> None:
        if i < concurrent:
            time.sleep(i * stagger_s)
        with Softphone(work / f"phone{i}", mic) as phone:
            phone.dial(agent.uri)
            phone.wait_established(10)
            phone.wait_ended(90)

    t0 = time.monotonic()
    cpu0 = sum(cpu_seconds(p) for p in pids)
    try:
        with ThreadPoolExecutor(max(1, concurrent)) as pool:
            list(pool.map(one, range(calls)))
        calls_wall = time.monotonic() - t0
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        time.sleep(1.0)
    finally:
        agent.stop()
    per_call = []
    all_turns = []
    every = []
    acks = _acknowledgements(flow)
    for jsonl in agent.calls():
        events = read_events(jsonl)
        every += events
        turns = _with_llm_paths(turn_latencies(events), events, acks)
        all_turns += turns
        per_call.append({"call_id": events[0]["call_id"] if events else jsonl.stem, "turns": turns,
                         "worker": events[0].get("worker") if events else None,
                         "transcript": [(e["kind"], e.get("text")) for e in events if e["kind"] in ("stt_final", "agent_say")],
                         "llm_paths": [e.get("via") for e in events if e["kind"] == "llm_reply"]})
    summary = {
        "calls": len(per_call),
        "turns": len(all_turns),
        "concurrent": concurrent,
        "workers": workers or 1,
        "prompt_cache_mb": PROMPT_CACHE_MB if prompt_cache_mb is None else prompt_cache_mb,
        "stagger_s": stagger_s,
        "wall_s": round(time.monotonic() - t0, 1),
        **_cpu_summary(cpu, calls_wall, concurrent),
        **_media_summary(every),
        "faults": _faults(every),
        "llm_paths": _llm_paths(every),
        "turn_ends": dict(Counter(e.get("why", "silence") for e in every if e["kind"] == "speech_end")),
        **{k: _pct([t[k] for t in all_turns]) for k in (*STAGES, "after_endpoint", "voice_to_voice") if all_turns},
        **_to_sound(all_turns),
        **_model_turns(all_turns),
    }
    return summary, per_call


def bench_webrtc(calls: int, flow: str, out: Path, codec: str = "PCMU") -> dict:
    """`calls` browser calls at once (aiortc peers in this process, the same script as `bench call`)
    to an agent of its own: the agent's CPU per call, frames its 20 ms sender sent late, and the turn
    latencies. The callers' own aiortc work runs on the same machine and is not counted."""
    import asyncio

    from callcenter.lab.browser_caller import BrowserCaller
    from callcenter.telephony.webrtc import use_host_candidates

    work = Path(tempfile.mkdtemp(prefix="callcenter-bench-webrtc-"))
    mic = scripted_caller(CALLER_LINES, work, lead_s=13.0, gap_s=11.0, tail_s=6.0)
    use_host_candidates(["127.0.0.1"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        web_port = s.getsockname()[1]
    agent = AgentProcess(work / "agent", _free_port(), 30000, flow, webrtc_port=web_port,
                         webrtc_max_calls=max(calls, 1)).start()
    mime = {"pcmu": "audio/PCMU", "opus": "audio/opus"}[codec.lower()]

    async def one() -> BrowserCaller:
        caller = await BrowserCaller(agent.webrtc_url, mic, codecs=(mime,)).call()
        try:
            await asyncio.wait_for(caller.ended.wait(), 90)
        except asyncio.TimeoutError:
            pass
        await caller.close()
        return caller

    async def run_all() -> list:
        return await asyncio.gather(*(one() for _ in range(calls)), return_exceptions=True)

    t0 = time.monotonic()
    cpu0 = cpu_seconds(agent.proc.pid)
    own0 = time.process_time()
    try:
        results = asyncio.run(run_all())
        calls_wall = time.monotonic() - t0
        cpu = cpu_seconds(agent.proc.pid) - cpu0
        callers_cpu = time.process_time() - own0
        time.sleep(1.0)
    finally:
        agent.stop()
    failed = [str(r) for r in results if isinstance(r, BaseException)]
    all_turns, every = [], []
    for jsonl in agent.calls():
        events = read_events(jsonl)
        every += events
        all_turns += turn_latencies(events)
    summary = {
        "calls": calls, "failed": len(failed), "codec": codec.upper(), "wall_s": round(calls_wall, 1),
        **_cpu_summary(cpu, calls_wall, calls),
        "callers_cores_busy": round(callers_cpu / calls_wall, 3),  # this process's aiortc callers
        "faults": _faults(every),
        "llm_paths": _llm_paths(every),
        **_media_summary(every),
        "turns": len(all_turns),
        **{k: _pct([t[k] for t in all_turns]) for k in ("after_endpoint", "voice_to_voice") if all_turns},
        **_to_sound(all_turns),
    }
    report = {"benchmark": "webrtc", "summary": summary, "errors": failed,
              "note": "core_share_per_call = agent CPU seconds / wall seconds / calls (the whole pipeline: "
                      "aiortc, denoise, VAD, STT, flow, TTS); compare with `bench call` for a SIP line. "
                      "late = a frame that left more than 20 ms after its tick."}
    return _write_report(out, report, work)


def _by_part(turns: list[dict], parts: int = 6) -> list[dict]:
    """Voice-to-voice percentiles of each successive part of a run (did latency hold throughout?)."""
    if not turns:
        return []
    t0 = min(t["at"] for t in turns)
    span = max(t["at"] for t in turns) - t0 or 1.0
    out = []
    for k in range(parts):
        part = [t["voice_to_voice"] for t in turns if min(parts - 1, int((t["at"] - t0) / span * parts)) == k]
        out.append(_pct(part) if part else {"n": 0})
    return out


def bench_soak(minutes: float, calls: int, workers: int, flow: str, out: Path, sample_s: float = 30.0,
               memory_trim_s: float | None = None, redial_s: float = 0.0) -> dict:
    """`calls` baresip callers at once, each calling again as soon as its call ends, for `minutes`,
    against `serve --workers N` behind Kamailio. Every `sample_s`: each worker's RSS and open file
    descriptors. At the end: growth after the warm-up (the first fifth), calls that never ended
    (no call_end in their events), late frames, voice-to-voice overall, per stage and per sixth of
    the run. `memory_trim_s` overrides the workers' memory trimming (0: off); `redial_s`: callers
    wait a random pause (uniform, this mean) before calling again, as real callers arrive."""
    import random
    import threading

    from callcenter.lab.fleet import Fleet

    work = Path(tempfile.mkdtemp(prefix="callcenter-soak-"))
    mic = scripted_caller(CALLER_LINES, work, lead_s=13.0, gap_s=11.0, tail_s=6.0)
    extra = f"memory_trim_s: {memory_trim_s}\n" if memory_trim_s is not None else ""
    fleet = Fleet(work / "fleet", flow, workers, _free_port(), _free_port(), rtp_port=30000,
                  extra_config=extra).start()
    pids = fleet.worker_pids()
    _wait_warmed(fleet)
    stop = threading.Event()
    placed = {"n": 0, "failed": 0}
    lock = threading.Lock()

    def caller(i: int) -> None:
        n = 0
        pauses = random.Random(i)
        while not stop.is_set():
            if n and redial_s:
                stop.wait(pauses.uniform(0, 2 * redial_s))
            n += 1
            with Softphone(work / f"phone{i}-{n % 2}", mic) as phone:
                phone.dial(fleet.uri)
                ok = phone.wait_established(10)
                if ok:
                    phone.wait_ended(90)
            with lock:
                placed["n"] += 1
                placed["failed"] += 0 if ok else 1

    samples = []
    t0 = time.monotonic()
    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(calls)]
    for i, t in enumerate(threads):
        t.start()
        time.sleep(2.0)  # staggered, so turns do not all fall on the same second
    try:
        while time.monotonic() - t0 < minutes * 60:
            time.sleep(sample_s)
            alive = [p for p in pids if Path(f"/proc/{p}").exists()]
            samples.append({"t_s": round(time.monotonic() - t0), "rss_mb": [round(rss_mb(p), 1) for p in alive],
                            "fds": [open_fds(p) for p in alive], "calls_placed": placed["n"]})
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        time.sleep(3)
        end_fds = [open_fds(p) for p in pids if Path(f"/proc/{p}").exists()]
        end_rss = [round(rss_mb(p), 1) for p in pids if Path(f"/proc/{p}").exists()]
        fleet.stop()
    warm = samples[max(0, len(samples) // 5 - 1)] if samples else None
    last = samples[-1] if samples else None
    unfinished, all_turns, every = [], [], []
    for jsonl in fleet.calls():
        events = read_events(jsonl)
        every += events
        if not events or events[-1]["kind"] != "call_end":
            unfinished.append(jsonl.stem)
        all_turns += turn_latencies(events)
    growth = ([round(100 * (b - a) / a, 1) for a, b in zip(warm["rss_mb"], last["rss_mb"])]
              if warm and last and len(warm["rss_mb"]) == len(last["rss_mb"]) else None)
    trims = fleet.log_lines("memory_trimmed")
    summary = {
        "minutes": minutes, "concurrent": calls, "workers": workers, "redial_s": redial_s,
        "memory_trim_s": memory_trim_s if memory_trim_s is not None else TRIM_EVERY_S,
        "calls_placed": placed["n"],
        "calls_failed_to_connect": placed["failed"], "calls_recorded": len(fleet.calls()),
        "calls_without_end": len(unfinished),
        "rss_mb_after_warmup": warm["rss_mb"] if warm else None, "rss_mb_at_end": last["rss_mb"] if last else None,
        "rss_growth_pct": growth, "fds_after_warmup": warm["fds"] if warm else None,
        "fds_at_end_of_load": last["fds"] if last else None, "fds_idle_after": end_fds, "rss_idle_after": end_rss,
        "workers_restarted": len(fleet.log_lines("worker_died")),
        "faults": _faults(every),
        "llm_paths": _llm_paths(every),
        **_media_summary(every),
        "memory_trims": len(trims),
        "memory_trim_ms": _pct([t["ms"] / 1000 for t in trims]) if trims else None,
        **({k: _pct([t[k] for t in all_turns]) for k in (*STAGES, "voice_to_voice")} if all_turns else {}),
        **_to_sound(all_turns),
        "voice_to_voice_by_sixth": _by_part(all_turns),
    }
    report = {"benchmark": "soak", "summary": summary, "samples": samples, "unfinished": unfinished[:20]}
    return _write_report(out, report, work)
