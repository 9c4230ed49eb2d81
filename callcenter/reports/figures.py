"""The figures of a period, from the calls' rows in the store, in the store's outcome vocabulary.
Every figure is defined in docs/guide/reports.md; the definitions here are the same words.

- offered: inbound calls that started in the period (the AI agent answers every one);
- contained: ended `ai_completed`, handled to the flow's end with no person;
- transferred: `transferred` or `queue_answered`;
- abandoned: the caller hung up first, outside a queue (`caller_hung_up`) or in one (`queue_abandoned`);
- timed out: `queue_timeout` (the queue's longest wait ran out; the flow went on);
- handle time: from answer to end;
- speed of answer: a queue's wait, of the calls a human agent answered;
- service level: of the calls that entered a queue, the share a human agent answered within the
  queue's threshold (`service_level_s`, 20 s unless the queue says otherwise);
- scorecard pass rate: of the scored calls an item applied to, the share that passed it (a
  supervisor's override counts instead of the automatic score)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any, Iterable

from callcenter.store.calls import ABANDONED, final_score

CONTAINED = ("ai_completed",)
TRANSFERRED = ("transferred", "queue_answered")
SERVICE_LEVEL_S = 20.0
INTERVALS = {"15m": 900, "1h": 3600, "1d": 86400}
TOP = 10


def _median(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return round(statistics.median(v), 1) if v else None


def _mean(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return round(sum(v) / len(v), 1) if v else None


def counts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    inbound = [r for r in rows if r.get("direction") != "outbound"]
    outbound = [r for r in rows if r.get("direction") == "outbound"]
    out = Counter(r.get("outcome") for r in inbound)
    handled = [r["ended"] - r["answered"] for r in rows if r.get("answered") and r.get("ended")]
    return {
        "offered": len(inbound),
        "contained": sum(out[o] for o in CONTAINED),
        "transferred": sum(out[o] for o in TRANSFERRED),
        "abandoned": sum(out[o] for o in ABANDONED),
        "timed_out": out["queue_timeout"], "callbacks": out["callback_requested"], "voicemails": out["voicemail"],
        "failed": out["failed"] + out["worker_lost"], "in_progress": sum(1 for r in rows if not r.get("ended")),
        "dialled": len(outbound), "dialled_answered": sum(1 for r in outbound if r.get("answered")),
        "handle_time_mean_s": _mean(handled), "handle_time_median_s": _median(handled),
        "voice_to_voice_median_ms": _median(r.get("voice_to_voice_p50_ms") for r in rows),
    }


def queues(rows: list[dict[str, Any]], service_levels: dict[str, float]) -> list[dict[str, Any]]:
    by_queue: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("queue"):
            by_queue[r["queue"]].append(r)
    out = []
    for name in sorted(by_queue):
        qrows = by_queue[name]
        threshold = service_levels.get(name, SERVICE_LEVEL_S)
        answered = [r for r in qrows if r.get("outcome") == "queue_answered"]
        within = [r for r in answered if (r.get("queue_wait_s") or 0) <= threshold]
        out.append({"queue": name, "entered": len(qrows), "answered": len(answered),
                    "abandoned": sum(1 for r in qrows if r.get("outcome") == "queue_abandoned"),
                    "timed_out": sum(1 for r in qrows if r.get("outcome") == "queue_timeout"),
                    "callbacks": sum(1 for r in qrows if r.get("outcome") == "callback_requested"),
                    "speed_of_answer_mean_s": _mean(r.get("queue_wait_s") for r in answered),
                    "service_level_s": threshold,
                    "service_level_pct": round(100 * len(within) / len(qrows), 1) if qrows else None})
    return out


def agents(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Human agents, from the calls a queue put through to them (`transfer_to` queue:NAME/AGENT)."""
    by_agent: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        to = r.get("transfer_to") or ""
        if r.get("outcome") == "queue_answered" and to.startswith("queue:") and "/" in to:
            by_agent[to.rsplit("/", 1)[1]].append(r)
    return [{"agent": a, "answered": len(rs),
             "handle_time_mean_s": _mean(r["ended"] - r["answered"] - (r.get("queue_wait_s") or 0)
                                         for r in rs if r.get("ended") and r.get("answered"))}
            for a, rs in sorted(by_agent.items())]


def funnel(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """For each flow, node by node: how many calls reached it, and how many callers left there
    (hung up, in or out of a queue), in the order the nodes were first reached."""
    out: dict[str, list[dict[str, Any]]] = {}
    for flow in sorted({r.get("flow") or "" for r in rows} - {""}):
        reached: Counter = Counter()
        left: Counter = Counter()
        order: list[str] = []
        for r in rows:
            if r.get("flow") != flow:
                continue
            nodes = r.get("nodes") or []
            for n in dict.fromkeys(nodes):
                reached[n] += 1
                if n not in order:
                    order.append(n)
            if nodes and r.get("outcome") in ABANDONED:
                left[nodes[-1]] += 1
        out[flow] = [{"node": n, "reached": reached[n], "left_here": left[n]} for n in order]
    return out


def scorecards(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each scorecard item: the calls it applied to, how many passed (a supervisor's override
    counts instead of the automatic score), its pass rate, and the overrides."""
    by_item: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        scores = r.get("scores") or {}
        for name, item in (scores.get("items") or {}).items():
            by_item[(scores.get("card") or r.get("flow") or "", name)].append(item)
    out = []
    for (card, name), items in sorted(by_item.items()):
        final = [final_score(i) for i in items]
        applied = [s for s in final if s != "n/a"]
        passed = sum(1 for s in applied if s == "pass")
        out.append({"flow": card, "item": name, "calls": len(applied), "passed": passed,
                    "pass_pct": round(100 * passed / len(applied), 1) if applied else None,
                    "overridden": sum(1 for i in items if i.get("override"))})
    return out


def report(rows: list[dict[str, Any]], since: float, until: float, interval_s: int,
           service_levels: dict[str, float] | None = None) -> dict[str, Any]:
    buckets: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        buckets[int((r["started"] - since) // interval_s)] += [r]
    steps = max(1, int(-(-(until - since) // interval_s)))
    return {
        "period": {"since": since, "until": until, "interval_s": interval_s},
        "totals": counts(rows),
        "intervals": [{"start": since + i * interval_s, **counts(buckets.get(i, []))} for i in range(steps)],
        "queues": queues(rows, service_levels or {}),
        "agents": agents(rows),
        "funnel": funnel(rows),
        "intents": Counter(r["intent"] for r in rows if r.get("intent")).most_common(TOP),
        "categories": Counter(c for r in rows for c in (r.get("categories") or [])
                              if not c.startswith("intent:")).most_common(TOP),
        "scorecards": scorecards(rows),
    }
