"""Every worker on every host says it is alive in the store: its SIP address, host, version, free
call slots and control API. The supervisor's console finds the fleet here (`tui --config C`), and
whoever looks next clears what a dead worker left (see `queues.QueueStore`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from callcenter.store.db import Database

WORKER_STALE_S = 4.0  # a worker silent this long is taken for dead


@dataclass(frozen=True)
class WorkerRow:
    worker: str  # its SIP address, host:port
    host: str
    version: str
    control: str  # its control API's URL ("" without one)
    free_slots: int
    seen: float


class WorkerRegistry:
    def __init__(self, db: Database, worker: str, host: str, version: str = "", control: str = "",
                 clock=time.time):
        self.db, self.worker, self.host, self.version, self.control, self.clock = db, worker, host, version, control, clock

    def beat(self, free_slots: int = 1) -> None:
        with self.db.transaction():
            self.upsert(free_slots)

    def upsert(self, free_slots: int) -> None:
        """This worker's row, inside the caller's transaction (the queue store beats with it too)."""
        self.db.execute(
            "INSERT INTO workers(worker, pid, seen, free_slots, host, version, control) VALUES(?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(worker) DO UPDATE SET pid=excluded.pid, seen=excluded.seen, free_slots=excluded.free_slots, "
            "host=excluded.host, version=excluded.version, control=excluded.control",
            (self.worker, os.getpid(), self.clock(), free_slots, self.host, self.version, self.control))

    def reap_calls(self, calls, stale_s: float = WORKER_STALE_S) -> int:
        """Give the open calls of workers silent for `stale_s` their end (`worker_lost`). The workers'
        rows stay for the queue store to clear (it removes their waiting callers too)."""
        with self.db.transaction():
            dead = [w for (w,) in self.db.execute("SELECT worker FROM workers WHERE seen < ? AND worker != ?",
                                                  (self.clock() - stale_s, self.worker))]
            return calls.lost(dead)

    def forget(self) -> None:
        with self.db.transaction():
            self.db.execute("DELETE FROM workers WHERE worker=?", (self.worker,))


def live_workers(db: Database, now: float | None = None, stale_s: float = WORKER_STALE_S) -> list[WorkerRow]:
    """The workers that beat within `stale_s`, by address."""
    now = time.time() if now is None else now
    rows = db.execute("SELECT worker, host, version, control, free_slots, seen FROM workers WHERE seen >= ? "
                      "ORDER BY worker", (now - stale_s,))
    return [WorkerRow(*row) for row in rows]
