"""Queued callbacks: a caller who pressed the queue's callback key keeps their place (their join
time, `QueueStore.leave(..., callback=...)`), and the fleet's dialer calls them when that place
comes up: when no caller who joined earlier is waiting and an agent of the queue is free. The
dialled call joins the queue at the same place (`QueueStore.join`), so the next agent is theirs.

A callback is `waiting` (due at `next_try`), `dialling` (an attempt counted before its call is
placed, so a crash never dials twice by mistake), then `done` with the result of the call that
reached them, or `failed` when its attempts ran out. No answer, busy, a failed call and an
answering machine are tried again after `retry_s` while attempts remain."""

from __future__ import annotations

import time
from dataclasses import dataclass

from callcenter.store.calls import MACHINE, UNANSWERED
from callcenter.store.db import Database
from callcenter.store.queues import free_agents
from callcenter.store.workers import WORKER_STALE_S

WAITING, DIALLING, DONE, FAILED_FOR_GOOD = "waiting", "dialling", "done", "failed"
RETRIED = (*UNANSWERED, MACHINE)  # not a person reached: tried again while attempts remain


@dataclass(frozen=True)
class Callback:
    call_id: str  # the call that asked for it
    queue: str
    number: str
    flow: str
    joined: float
    state: str
    attempts: int
    max_attempts: int
    retry_s: float
    next_try: float
    result: str | None
    dial_call_id: str | None
    updated: float


COLUMNS = ("call_id, queue, number, flow, joined, state, attempts, max_attempts, retry_s, next_try, result, "
           "dial_call_id, updated")


class CallbackStore:
    def __init__(self, db: Database, clock=time.time):
        self.db, self.clock = db, clock

    def _rows(self, where: str, *args) -> list[Callback]:
        with self.db.reading():
            return [Callback(*r) for r in self.db.execute(f"SELECT {COLUMNS} FROM callbacks {where}", args)]

    def get(self, call_id: str) -> Callback | None:
        rows = self._rows("WHERE call_id=?", call_id)
        return rows[0] if rows else None

    def pending(self) -> list[Callback]:
        """Callbacks not yet done, oldest place first."""
        return self._rows("WHERE state IN ('waiting', 'dialling') ORDER BY joined")

    def due(self) -> list[Callback]:
        """Waiting callbacks whose place has come up: due, no caller who joined earlier waiting in
        their queue, and an agent of the queue free."""
        now = self.clock()
        out = []
        with self.db.reading():
            rows = [Callback(*r) for r in self.db.execute(
                f"SELECT {COLUMNS} FROM callbacks WHERE state='waiting' AND next_try <= ? ORDER BY joined", (now,))]
            for cb in rows:
                ahead = self.db.execute(
                    "SELECT 1 FROM callers c JOIN workers w ON c.worker = w.worker WHERE c.queue=? AND c.joined < ? "
                    "AND w.seen >= ? LIMIT 1", (cb.queue, cb.joined, now - WORKER_STALE_S))
                earlier = self.db.execute("SELECT 1 FROM callbacks WHERE queue=? AND joined < ? AND state='dialling' "
                                          "LIMIT 1", (cb.queue, cb.joined))
                if ahead or earlier or not free_agents(self.db, cb.queue, now, ready=True):
                    continue
                out.append(cb)
        return out

    def claim(self, cb: Callback) -> int | None:
        """Count an attempt before it is placed (None: another dialer took it)."""
        now = self.clock()
        with self.db.transaction():
            rows = self.db.execute("SELECT state, attempts FROM callbacks WHERE call_id=?", (cb.call_id,))
            if not rows or rows[0][0] != WAITING:
                return None
            attempt = rows[0][1] + 1
            self.db.execute("UPDATE callbacks SET state='dialling', attempts=?, dial_call_id=NULL, updated=? "
                            "WHERE call_id=?", (attempt, now, cb.call_id))
            return attempt

    def unclaim(self, cb: Callback, attempt: int) -> None:
        """Not placed after all (no free call slot): not an attempt."""
        with self.db.transaction():
            self.db.execute("UPDATE callbacks SET state='waiting', attempts=?, updated=? WHERE call_id=? AND "
                            "state='dialling'", (attempt - 1, self.clock(), cb.call_id))

    def placed(self, cb: Callback, dial_call_id: str) -> None:
        with self.db.transaction():
            self.db.execute("UPDATE callbacks SET dial_call_id=?, updated=? WHERE call_id=?",
                            (dial_call_id, self.clock(), cb.call_id))

    def finished(self, call_id: str, result: str) -> str:
        """The attempt's call ended with `result` (the store's outcome words): tried again later,
        or done; returns the callback's new state."""
        now = self.clock()
        with self.db.transaction():
            rows = self.db.execute("SELECT attempts, max_attempts, retry_s FROM callbacks WHERE call_id=?", (call_id,))
            if not rows:
                return DONE
            attempts, most, retry_s = rows[0]
            if result in RETRIED:
                state = WAITING if attempts < most else FAILED_FOR_GOOD
            else:
                state = DONE
            self.db.execute("UPDATE callbacks SET state=?, result=?, next_try=?, updated=? WHERE call_id=?",
                            (state, result, now + retry_s if state == WAITING else 0, now, call_id))
            return state

    def unfinished(self, older_than_s: float) -> list[Callback]:
        """Attempts a dialer left `dialling` (it died, or this one restarted) this long ago."""
        return self._rows("WHERE state='dialling' AND updated < ?", self.clock() - older_than_s)


__all__ = ["Callback", "CallbackStore", "DIALLING", "DONE", "FAILED_FOR_GOOD", "RETRIED", "WAITING"]
