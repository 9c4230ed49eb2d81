"""Queues of callers waiting for human agents, and the agents' states, shared by every worker.

The store every worker shares (`store:` in the server config, see `callcenter.store`): embedded
SQLite for the workers of one machine, PostgreSQL for several. The state is a few rows that change a
few times a second; each change is one short exclusive transaction, so two workers never give one
agent to two callers, and a committed change survives a `kill -9` of the worker that made it.

A caller's place is their join time: position = callers of the same queue, on live workers, who
joined earlier. Each worker beats its heart every `HEARTBEAT_S`; the callers and agent legs of a
worker silent for `WORKER_STALE_S` are removed by whichever worker looks next, so a killed worker's
callers leave the queue and everyone behind them moves up, while the other workers' callers keep
their join times and so their places.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from callcenter.store.calls import CallRecords
from callcenter.store.db import Database, StoreError, open_database
from callcenter.store.schema import migrate
from callcenter.store.workers import WORKER_STALE_S, WorkerRegistry

HEARTBEAT_S = 1.0
DEFAULT_HANDLE_S = 180.0  # expected talk + wrap-up time of a call before the queue has any history
HANDLE_HISTORY = 20  # answered calls the expected wait is averaged over
RETRY_S = 5.0  # an agent whose phone turned a call down at once (busy, declined) is not rung again sooner
STRATEGIES = ("longest_idle", "round_robin", "ring_all")


class AgentState(StrEnum):
    LOGGED_OUT = "logged_out"
    AVAILABLE = "available"
    RINGING = "ringing"
    ON_CALL = "on_call"
    WRAP_UP = "wrap_up"
    PAUSED = "paused"


class QueueStoreError(StoreError):
    """The queue store refused (a corrupt or unreadable file, an unknown agent): said in one line."""


@dataclass(frozen=True)
class Agent:
    name: str
    uri: str
    skills: tuple[str, ...]
    state: AgentState
    since: float
    reason: str = ""
    call_id: str | None = None


@dataclass(frozen=True)
class Ring:
    """Agents rung for one caller (one, or all of them for ring_all)."""
    call_id: str
    agents: tuple[Agent, ...]


@dataclass
class QueueSnapshot:
    name: str
    waiting: int = 0
    longest_wait_s: float = 0.0
    available: int = 0
    busy: int = 0
    paused: int = 0
    answered_today: int = 0
    abandoned_today: int = 0  # hung up while waiting
    timed_out_today: int = 0  # waited the queue's longest wait and went the flow's way
    callbacks_today: int = 0  # left a number to be called back
    callbacks_pending: int = 0  # ...and not yet called back (waiting their turn, or being dialled)
    within_sl_today: int = 0
    service_level_s: float = 20.0
    callers: list[dict] = field(default_factory=list)

    @property
    def service_level(self) -> float | None:
        """The share of today's offered calls answered within the service level (abandoned count
        against it), or None before the first."""
        offered = self.answered_today + self.abandoned_today + self.timed_out_today
        return round(self.within_sl_today / offered, 3) if offered else None

    def as_dict(self) -> dict:
        return {"name": self.name, "waiting": self.waiting, "longest_wait_s": round(self.longest_wait_s, 1),
                "available": self.available, "busy": self.busy, "paused": self.paused,
                "answered_today": self.answered_today, "abandoned_today": self.abandoned_today,
                "timed_out_today": self.timed_out_today, "callbacks_today": self.callbacks_today,
                "callbacks_pending": self.callbacks_pending,
                "service_level": self.service_level, "service_level_s": self.service_level_s,
                "callers": self.callers}




# a callback holds its place in the queue while it is due and the fleet's dialer is alive, or while it
# is being dialled and its call has not yet joined the queue (then the call holds the place itself)
CALLBACK_HOLDS = ("(state='waiting' AND next_try <= ? AND EXISTS (SELECT 1 FROM leases WHERE name='dialer' "
                  "AND until > ?) OR state='dialling' AND (dial_call_id IS NULL OR dial_call_id NOT IN "
                  "(SELECT call_id FROM callers)))")


def _serves(name: str, agent_skills, members: set[str], skills: set[str]) -> bool:
    """Does this agent take a queue's calls (named in it, or with one of its skills)?"""
    return name in members or bool(skills & set(agent_skills))


def free_agents(db: Database, queue: str, now: float, ready: bool = False) -> int:
    """How many of `queue`'s agents are free now: available, or at the end of their wrap-up; with
    `ready`, not in the pause after their phone turned a call down either (`retry_after`)."""
    row = db.execute("SELECT members, skills FROM queues WHERE name=?", (queue,))
    if not row:
        return 0
    members, skills = set(json.loads(row[0][0])), set(json.loads(row[0][1]))
    return sum(1 for name, agent_skills, state, wrap_until, retry_after in db.execute(
        "SELECT name, skills, state, wrap_until, retry_after FROM agents")
        if (state == AgentState.AVAILABLE or state == AgentState.WRAP_UP and wrap_until <= now)
        and (not ready or retry_after <= now) and _serves(name, json.loads(agent_skills), members, skills))


def _midnight(now: float) -> float:
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


class QueueStore:
    """The shared state of queues and agents (see the module's docstring). Every method is one
    short transaction; safe from several threads and processes."""

    def __init__(self, store: Database | str | Path, worker: str, clock=time.time, host: str = "",
                 registry: WorkerRegistry | None = None):
        """`store`: the shared database, or its URL (a plain path is an SQLite file), migrated on open.
        `registry`: this worker's row in the store (the server's, with its control API), else one of
        its own."""
        self.worker = worker
        self.clock = clock
        try:
            self.db = store if isinstance(store, Database) else open_database(store)
            migrate(self.db)
        except StoreError as exc:
            raise QueueStoreError(str(exc)) from None
        self.calls = CallRecords(self.db, worker, host, clock)
        self.registry = registry or WorkerRegistry(self.db, worker, host, clock=clock)

    # ---- plumbing
    def _tx(self, fn, *args):
        try:
            with self.db.transaction():
                return fn(*args)
        except StoreError as exc:
            raise QueueStoreError(str(exc)) from None

    def _q(self, sql: str, *args) -> list[tuple]:
        return self.db.execute(sql, args)

    def _x(self, sql: str, args: tuple = ()) -> None:
        self.db.execute(sql, args)

    def close(self) -> None:
        self.db.close()

    # ---- workers
    def heartbeat(self, free_slots: int = 1) -> list[str]:
        """Say this worker is alive, and how many more calls it can place (an agent's leg needs a
        call slot on the caller's worker); remove what dead workers left. Returns the call_ids removed."""
        def run():
            now = self.clock()
            self.registry.upsert(free_slots)
            return self._reap(now)
        return self._tx(run)

    def take_over(self) -> list[str]:
        """A worker starting on this address: whatever an earlier process here left in the queues
        (it was killed, or restarted faster than WORKER_STALE_S) belongs to calls that are gone."""
        def run():
            now = self.clock()
            lost = self._reap(now, [self.worker])
            self.registry.upsert(1)
            return lost
        return self._tx(run)

    def _reap(self, now: float, dead: list[str] | None = None) -> list[str]:
        dead = dead or [w for (w,) in self._q("SELECT worker FROM workers WHERE seen < ? AND worker != ?",
                                              now - WORKER_STALE_S, self.worker)]
        if not dead:
            return []
        marks = ",".join("?" * len(dead))
        gone = self._q(f"SELECT call_id, queue, joined FROM callers WHERE worker IN ({marks})", *dead)
        for call_id, queue, joined in gone:
            self._log(now, queue, call_id, None, "lost", now - joined)
        self._x(f"DELETE FROM callers WHERE worker IN ({marks})", dead)
        self._x(f"UPDATE agents SET state='available', since=?, call_id=NULL, worker=NULL, idle_since=? "
                         f"WHERE worker IN ({marks}) AND state IN ('ringing', 'on_call')", (now, now, *dead))
        self._x(f"DELETE FROM workers WHERE worker IN ({marks})", dead)
        self.calls.lost(dead)  # every call they had gets a row that says how it ended
        return [c for c, _, _ in gone]

    def forget_worker(self) -> None:
        """This worker is shutting down cleanly: its callers have ended their calls."""
        self._tx(lambda: self._x("DELETE FROM workers WHERE worker=?", (self.worker,)))

    # ---- configuration
    def define_agents(self, agents: list[tuple[str, str, tuple[str, ...], bool]]) -> list[str]:
        """(name, uri, skills, logged in at start) of the configured agents. An agent already known
        keeps its state (another worker, or this one before a restart, set it). An agent no longer
        in the config leaves the store (once off any call): never shown available, counted free or
        offered for a transfer again. Returns the names removed."""
        def run():
            now = self.clock()
            for name, uri, skills, logged_in in agents:
                self._x(
                    "INSERT INTO agents(name, uri, skills, state, since, idle_since) VALUES(?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET uri=excluded.uri, skills=excluded.skills",
                    (name, uri, json.dumps(list(skills)), "available" if logged_in else "logged_out", now, now))
            keep = {name for name, *_ in agents}
            gone = [name for (name,) in self._q("SELECT name FROM agents WHERE state NOT IN ('ringing', 'on_call')")
                    if name not in keep]
            for name in gone:
                self._x("DELETE FROM agents WHERE name=?", (name,))
                self._log(now, "", None, name, "agent_removed", None)
            return gone
        return self._tx(run)

    def define_queue(self, name: str, members: list[str], skills: list[str], strategy: str,
                     service_level_s: float) -> None:
        self._tx(lambda: self._x(
            "INSERT INTO queues VALUES(?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET members=excluded.members, "
            "skills=excluded.skills, strategy=excluded.strategy, service_level_s=excluded.service_level_s",
            (name, json.dumps(members), json.dumps(skills), strategy, service_level_s)))

    # ---- agents
    def _agent_rows(self, where: str = "", *args) -> list[Agent]:
        now = self.clock()
        rows = self._q("SELECT name, uri, skills, state, since, reason, call_id, wrap_until FROM agents "
                       + where + " ORDER BY name", *args)
        out = []
        for name, uri, skills, state, since, reason, call_id, wrap_until in rows:
            if state == "wrap_up" and wrap_until <= now:  # read outside a transaction: as it will be
                state, since, reason = "available", wrap_until, ""
            out.append(Agent(name, uri, tuple(json.loads(skills)), AgentState(state), since, reason, call_id))
        return out

    def agents(self) -> list[Agent]:
        with self.db.reading():
            return self._agent_rows()

    def agent(self, name: str) -> Agent:
        with self.db.reading():
            found = self._agent_rows("WHERE name=?", name)
        if not found:
            raise QueueStoreError(f"no agent named {name!r}")
        return found[0]

    def set_agent_state(self, name: str, action: str, reason: str = "") -> Agent:
        """An agent's own change: login, logout, pause (with a reason), resume. Refused while they
        ring or talk (they finish the call first), with a message that says so."""
        def run():
            found = self._agent_rows("WHERE name=?", name)
            if not found:
                raise QueueStoreError(f"no agent named {name!r}")
            state = found[0].state
            now = self.clock()
            allowed = {"login": {AgentState.LOGGED_OUT}, "resume": {AgentState.PAUSED},
                       "pause": {AgentState.AVAILABLE, AgentState.WRAP_UP},
                       "logout": {AgentState.AVAILABLE, AgentState.PAUSED, AgentState.WRAP_UP}}
            if action not in allowed:
                raise QueueStoreError(f"unknown agent action {action!r}; one of {', '.join(allowed)}")
            if state not in allowed[action]:
                raise QueueStoreError(f"{name} is {state.value}: cannot {action} now")
            new = {"login": "available", "resume": "available", "pause": "paused", "logout": "logged_out"}[action]
            self._x("UPDATE agents SET state=?, reason=?, since=?, idle_since=CASE WHEN ?='available' "
                             "THEN ? ELSE idle_since END WHERE name=?",
                             (new, reason if action == "pause" else "", now, new, now, name))
            self._log(now, "", None, name, f"agent_{action}", None)
            return self._agent_rows("WHERE name=?", name)[0]
        return self._tx(run)

    # ---- callers
    def join(self, call_id: str, queue: str) -> None:
        """The caller joins the queue now; a dialled callback joins at the place its caller left."""
        def run():
            now = self.clock()
            kept = self._q("SELECT joined FROM callbacks WHERE dial_call_id=? AND queue=?", call_id, queue)
            joined = kept[0][0] if kept else now
            self._x("INSERT INTO callers(call_id, queue, worker, joined) VALUES(?, ?, ?, ?) ON CONFLICT(call_id) "
                    "DO UPDATE SET queue=excluded.queue, worker=excluded.worker, joined=excluded.joined, "
                    "state='waiting', tried='[]'", (call_id, queue, self.worker, joined))
            self._log(now, queue, call_id, None, "join", None)
        self._tx(run)

    def position(self, call_id: str) -> tuple[int, int]:
        """(1-based place in the queue, callers waiting in it); (0, n) if the caller is not in it."""
        with self.db.reading():
            row = self._q("SELECT queue, joined FROM callers WHERE call_id=?", call_id)
            if not row:
                return 0, 0
            queue, joined = row[0]
            now = self.clock()
            ahead, total = self._q(
                "SELECT SUM(CASE WHEN c.joined < ? THEN 1 ELSE 0 END), COUNT(*) FROM callers c JOIN workers w ON c.worker = w.worker "
                "WHERE c.queue=? AND (w.seen >= ? OR w.worker = ?)", joined, queue, now - WORKER_STALE_S,
                self.worker)[0]
            kept = self._q(f"SELECT SUM(CASE WHEN joined < ? THEN 1 ELSE 0 END), COUNT(*) FROM callbacks "
                           f"WHERE queue=? AND {CALLBACK_HOLDS}", joined, queue, now, now)[0]
            return int(ahead or 0) + int(kept[0] or 0) + 1, int(total) + int(kept[1] or 0)

    def expected_wait_s(self, call_id: str) -> float:
        """Place × the mean handle time of the queue's recent calls ÷ the agents who take them."""
        position, _ = self.position(call_id)
        with self.db.reading():
            row = self._q("SELECT queue FROM callers WHERE call_id=?", call_id)
            if not row:
                return 0.0
            queue = row[0][0]
            talks = [t for (t,) in self._q("SELECT talk_s FROM queue_log WHERE queue=? AND kind='done' "
                                           "ORDER BY t DESC LIMIT ?", queue, HANDLE_HISTORY)]
        handle = sum(talks) / len(talks) if talks else DEFAULT_HANDLE_S
        members = self._members(queue)
        working = sum(1 for a in members if a.state not in (AgentState.LOGGED_OUT, AgentState.PAUSED))
        return position * handle / max(1, working)

    def _members(self, queue: str) -> list[Agent]:
        with self.db.reading():
            row = self._q("SELECT members, skills FROM queues WHERE name=?", queue)
            agents = self._agent_rows()
        if not row:
            return []
        members, skills = set(json.loads(row[0][0])), set(json.loads(row[0][1]))
        return [a for a in agents if _serves(a.name, a.skills, members, skills)]

    def claim(self, call_id: str, free_slots: int = 1) -> Ring | None:
        """If this caller is the first in their queue not already ringing someone (callers whose
        worker has no call slot free for the agent's leg let the next one by), and an agent of the
        queue is free, reserve one (ring_all: every free one) by the queue's strategy: their state
        becomes ringing. Agents this caller already rang unanswered come last in line."""
        def run():
            now = self.clock()
            self.registry.upsert(free_slots)
            self._reap(now)
            row = self._q("SELECT queue, state, tried, joined FROM callers WHERE call_id=?", call_id)
            if not row or row[0][1] != "waiting":
                return None
            queue, _, tried, mine = row[0]
            self._x("UPDATE agents SET state='available', since=wrap_until WHERE state='wrap_up' "
                             "AND wrap_until <= ?", (now,))
            head = self._q("SELECT c.call_id FROM callers c JOIN workers w ON c.worker = w.worker WHERE c.queue=? "
                           "AND c.state='waiting' AND w.free_slots > 0 ORDER BY c.joined LIMIT 1", queue)
            if not head or head[0][0] != call_id:
                return None
            if self._q(f"SELECT 1 FROM callbacks WHERE queue=? AND joined < ? AND {CALLBACK_HOLDS} LIMIT 1",
                       queue, mine, now, now):
                return None  # a caller who asked to be called back is ahead: the next agent is theirs
            qrow = self._q("SELECT members, skills, strategy FROM queues WHERE name=?", queue)
            if not qrow:
                return None
            members, skills, strategy = set(json.loads(qrow[0][0])), set(json.loads(qrow[0][1])), qrow[0][2]
            free = [a for a in self._agent_rows("WHERE state IN ('available', 'wrap_up') AND retry_after <= ?", now)
                    if a.state == AgentState.AVAILABLE and _serves(a.name, a.skills, members, skills)]
            if not free:
                return None
            tried = set(json.loads(tried))
            fresh = [a for a in free if a.name not in tried]
            if not fresh:  # everyone free has been tried: go round again
                self._x("UPDATE callers SET tried='[]' WHERE call_id=?", (call_id,))
                fresh = free
            order = {name: (idle, rung) for name, idle, rung in self._q("SELECT name, idle_since, last_rung FROM agents")}
            if strategy == "round_robin":
                fresh.sort(key=lambda a: (order[a.name][1], a.name))
            else:
                fresh.sort(key=lambda a: (order[a.name][0], a.name))
            chosen = fresh if strategy == "ring_all" else fresh[:1]
            for a in chosen:
                self._x("UPDATE agents SET state='ringing', since=?, call_id=?, worker=?, last_rung=? "
                                 "WHERE name=?", (now, call_id, self.worker, now, a.name))
            self._x("UPDATE callers SET state='ringing' WHERE call_id=?", (call_id,))
            self._log(now, queue, call_id, ",".join(a.name for a in chosen), "ring", None)
            return Ring(call_id, tuple(chosen))
        return self._tx(run)

    def ring_ended(self, call_id: str, answered_by: str | None, rung: list[str],
                   unreachable: dict[str, str] | None = None, declined: list[str] | None = None) -> None:
        """The agents rung for this caller: one answered (on call now; the others free again), or
        nobody did (all free again, and the caller waits in their old place for the next). Agents
        whose phone refused the call (`unreachable`: name -> why) are paused with the reason; those
        whose phone turned it down at once (`declined`: busy, declined) are not rung for RETRY_S."""
        unreachable = unreachable or {}
        declined = declined or []

        def run():
            now = self.clock()
            row = self._q("SELECT queue, joined, tried FROM callers WHERE call_id=?", call_id)
            for name, why in unreachable.items():
                self._x("UPDATE agents SET state='paused', reason=?, since=?, call_id=NULL, worker=NULL "
                                 "WHERE name=? AND state='ringing' AND call_id=?",
                                 (f"unreachable: {why}"[:200], now, name, call_id))
                self._log(now, row[0][0] if row else "", call_id, name, "agent_unreachable", None)
            for name in rung:
                if name != answered_by and name not in unreachable:
                    self._x("UPDATE agents SET state='available', since=?, call_id=NULL, worker=NULL, "
                                     "retry_after=? WHERE name=? AND state='ringing' AND call_id=?",
                                     (now, now + RETRY_S if name in declined else 0, name, call_id))
            if answered_by is None:
                if row:
                    tried = sorted(set(json.loads(row[0][2])) | set(rung))
                    self._x("UPDATE callers SET state='waiting', tried=? WHERE call_id=?",
                                     (json.dumps(tried), call_id))
                    self._log(now, row[0][0], call_id, ",".join(rung), "ring_no_answer", None)
                return
            self._x("UPDATE agents SET state='on_call', since=? WHERE name=?", (now, answered_by))
            if row:
                self._x("DELETE FROM callers WHERE call_id=?", (call_id,))
                self._log(now, row[0][0], call_id, answered_by, "answered", now - row[0][1])
        self._tx(run)

    def agent_call_ended(self, name: str, queue: str, wrap_up_s: float, talk_s: float) -> None:
        """The agent's call is over: wrap-up for the queue's seconds, then available again."""
        def run():
            now = self.clock()
            self._x("UPDATE agents SET state=?, since=?, wrap_until=?, idle_since=?, call_id=NULL, "
                             "worker=NULL WHERE name=? AND state='on_call'",
                             ("wrap_up" if wrap_up_s > 0 else "available", now, now + wrap_up_s, now + wrap_up_s, name))
            self._log(now, queue, None, name, "done", None, talk_s + wrap_up_s)
        self._tx(run)

    def leave(self, call_id: str, kind: str, callback: tuple[str, str, int, float] | None = None) -> None:
        """The caller leaves the queue unanswered: `abandoned` (hung up), `timeout`, `callback`.
        With `callback` (number, flow, attempts, retry_s) a callback keeps their place, to be dialled
        when it comes up."""
        def run():
            now = self.clock()
            row = self._q("SELECT queue, joined FROM callers WHERE call_id=?", call_id)
            if not row:
                return
            if callback is not None:
                number, flow, attempts, retry_s = callback
                self._x("INSERT INTO callbacks(call_id, queue, number, flow, joined, requested, max_attempts, retry_s, "
                        "updated) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(call_id) DO NOTHING",
                        (call_id, row[0][0], number, flow, row[0][1], now, attempts, retry_s, now))
            self._x("UPDATE agents SET state='available', since=?, call_id=NULL, worker=NULL "
                             "WHERE call_id=? AND state='ringing'", (now, call_id))
            self._x("DELETE FROM callers WHERE call_id=?", (call_id,))
            self._log(now, row[0][0], call_id, None, kind, now - row[0][1])
        self._tx(run)

    def _log(self, t: float, queue: str, call_id: str | None, agent: str | None, kind: str,
             wait_s: float | None, talk_s: float | None = None) -> None:
        self._x("INSERT INTO queue_log VALUES(?, ?, ?, ?, ?, ?, ?)", (t, queue, call_id, agent, kind,
                                                                                wait_s, talk_s))

    # ---- what the console shows
    def snapshot(self) -> tuple[list[QueueSnapshot], list[Agent]]:
        """Every defined queue with today's figures, and every agent."""
        now = self.clock()
        day = _midnight(now)
        with self.db.reading():
            queues = self._q("SELECT name, members, skills, service_level_s FROM queues ORDER BY name")
            agents = self._agent_rows()
            live = {w for (w,) in self._q("SELECT worker FROM workers WHERE seen >= ?", now - WORKER_STALE_S)}
            live.add(self.worker)
            callers = self._q("SELECT call_id, queue, worker, joined, state FROM callers ORDER BY joined")
            log = self._q("SELECT queue, kind, wait_s FROM queue_log WHERE t >= ? AND kind IN "
                          "('answered', 'abandoned', 'timeout', 'callback')", day)
            pending = dict(self._q("SELECT queue, COUNT(*) FROM callbacks WHERE state IN ('waiting', 'dialling') "
                                   "GROUP BY queue"))
        out = []
        for name, members, skills, sl in queues:
            members, skills = set(json.loads(members)), set(json.loads(skills))
            mine = [a for a in agents if _serves(a.name, a.skills, members, skills)]
            snap = QueueSnapshot(name, service_level_s=sl)
            waiting = [c for c in callers if c[1] == name and c[2] in live]
            snap.waiting = len(waiting)
            snap.longest_wait_s = max((now - c[3] for c in waiting), default=0.0)
            snap.callers = [{"call_id": c[0], "worker": c[2], "wait_s": round(now - c[3], 1), "state": c[4]}
                            for c in waiting]
            snap.available = sum(a.state == AgentState.AVAILABLE for a in mine)
            snap.busy = sum(a.state in (AgentState.RINGING, AgentState.ON_CALL, AgentState.WRAP_UP) for a in mine)
            snap.paused = sum(a.state == AgentState.PAUSED for a in mine)
            snap.callbacks_pending = int(pending.get(name, 0))
            for queue, kind, wait_s in log:
                if queue != name:
                    continue
                if kind == "answered":
                    snap.answered_today += 1
                    snap.within_sl_today += (wait_s or 0) <= sl
                elif kind == "abandoned":
                    snap.abandoned_today += 1
                elif kind == "timeout":
                    snap.timed_out_today += 1
                elif kind == "callback":
                    snap.callbacks_today += 1
            out.append(snap)
        return out, agents
