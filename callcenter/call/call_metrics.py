"""What `/metrics` tells Prometheus about this process's calls: calls and turns, per-stage latency
of every answered turn, frames that left late, faults, barge-ins, rejections, memory, and how often
this worker's slot was restarted. Fed by each call's events as they are emitted."""

from __future__ import annotations

import os
import time
from typing import Callable

from callcenter.call import events as ev
from callcenter.call.latency import STAGES, turn_latencies
from callcenter.memory import rss_mb
from callcenter.metrics import LATENCY_BUCKETS_S, Counter, Gauge, Histogram, Registry

FAULT_KINDS = (ev.STAGE_SLOW, ev.STAGE_FALLBACK, ev.TROUBLE, ev.ERROR)
SNAPSHOT_REUSE_S = 0.5  # the queue gauges of one scrape read the shared store once
RESTARTS_ENV = "CALLCENTER_WORKER_RESTARTS"  # set by `serve --workers N` for each worker it starts
WORKER_ENV = "CALLCENTER_WORKER"


class CallMetrics:
    def __init__(self, active: Callable[[], dict[tuple[str, ...], float]],
                 rejected: Callable[[], dict[tuple[str, ...], float]]):
        r = self.registry = Registry()
        self.calls = r.add(Counter("callcenter_calls_total", "Calls connected, by transport.", ("transport",)))
        r.add(Gauge("callcenter_calls_active", "Calls in progress, by transport.", active, ("transport",)))
        r.add(Gauge("callcenter_calls_rejected_total", "Calls refused (busy, not allowed, Call-ID in use), "
                    "by transport and reason.", rejected, ("transport", "reason"), kind="counter"))
        self.turns = r.add(Counter("callcenter_turns_total", "Caller turns the agent answered."))
        self.stage = r.add(Histogram("callcenter_turn_stage_seconds", "Latency of each stage of an answered "
                                     "caller turn (voice_to_voice: caller's last voiced frame to the "
                                     "agent's first frame out).", LATENCY_BUCKETS_S, ("stage",)))
        self.frames = r.add(Counter("callcenter_frames_sent_total", "20 ms frames sent to callers."))
        self.late = r.add(Counter("callcenter_frames_late_total", "Frames sent more than 20 ms late."))
        self.faults = r.add(Counter("callcenter_stage_faults_total", "Stages that were slow, fell back to "
                                    "their backup, or failed, by kind.", ("kind",)))
        self.barge_ins = r.add(Counter("callcenter_barge_ins_total", "Callers who interrupted the agent."))
        restarts = int(os.environ.get(RESTARTS_ENV, "0") or 0)
        worker = os.environ.get(WORKER_ENV, "")
        r.add(Gauge("callcenter_worker_restarts", "Times this worker's slot was restarted after it died "
                    "(0 outside `serve --workers`).", lambda: {(worker,): restarts}, ("worker",)))
        r.add(Gauge("callcenter_resident_memory_bytes", "Resident memory of this process.",
                    lambda: rss_mb() * 2**20))
        self.watch_models()

    def watch_models(self) -> None:
        """Offline model turns by path (the hybrid: embedding, model, unsure, busy, failed)."""
        from callcenter.dialog.local_llm import PATHS

        self.registry.add(Gauge("callcenter_llm_turns_total", "llm-node turns of the offline hybrid, by the path "
                                "that decided: embedding (clear at once), model, and the embedding path's "
                                "reply when the model was unsure, busy (admission control) or failed.",
                                lambda: {(p,): n for p, n in PATHS.items()}, ("path",), kind="counter"))

    def watch_queues(self, store) -> None:
        """The contact center's queues and agents (the shared store: every worker reports the same
        figures, so scrape one worker or take the max)."""
        taken: list = [0.0, None]  # (when, snapshot): the eight gauges of one scrape share one read

        def board():
            now = time.monotonic()
            if taken[1] is None or now - taken[0] > SNAPSHOT_REUSE_S:
                taken[:] = [now, store.snapshot()]
            return taken[1]

        def per_queue(field: str):
            return lambda: {(q.name,): getattr(q, field) for q in board()[0]}

        r = self.registry
        r.add(Gauge("callcenter_queue_waiting", "Callers waiting in each queue.", per_queue("waiting"), ("queue",)))
        r.add(Gauge("callcenter_queue_longest_wait_seconds", "The longest current wait in each queue.",
                    per_queue("longest_wait_s"), ("queue",)))
        for field, help in (("answered_today", "answered"), ("abandoned_today", "abandoned (hung up waiting)"),
                            ("timed_out_today", "that waited the queue's max_wait_s"),
                            ("callbacks_today", "that left a number for a callback")):
            r.add(Gauge(f"callcenter_queue_{field}", f"Calls {help} today, per queue.", per_queue(field), ("queue",)))
        r.add(Gauge("callcenter_agents", "Human agents in each state.",
                    lambda: {(s,): sum(a.state.value == s for a in board()[1]) for s in
                             ("logged_out", "available", "ringing", "on_call", "wrap_up", "paused")}, ("state",)))

    def watch(self, events: ev.CallEvents, transport: str) -> None:
        """Count this call and follow its events."""
        self.calls.inc(transport=transport)
        turns: dict[int, list[dict]] = {}

        def on_event(e: ev.Event) -> None:
            if e.kind in FAULT_KINDS:
                self.faults.inc(kind=e.kind)
            elif e.kind == ev.BARGE_IN:
                self.barge_ins.inc()
            elif e.kind == ev.MEDIA:
                self.frames.inc(e.data.get("frames_out", 0))
                self.late.inc(e.data.get("late_frames", 0))
            if e.turn == 0:
                return
            seen = turns.setdefault(e.turn, [])
            seen.append({"kind": e.kind, "turn": e.turn, "t": e.t, "wall": e.wall, **e.data})
            if e.kind == ev.FIRST_RTP_OUT:
                for t in turn_latencies(turns.pop(e.turn)):
                    self.turns.inc()
                    for stage in (*STAGES, "voice_to_voice"):
                        self.stage.observe(t[stage], stage=stage)
            for old in [n for n in turns if n < e.turn - 1]:  # turns that were never answered
                del turns[old]

        events.subscribe(on_event)

    def render(self) -> str:
        return self.registry.render()
