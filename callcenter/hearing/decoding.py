"""The order in which a process's calls get the recognizer: most urgent first.

Every call of a worker shares one recognizer, which runs `workers` decodes at a time. When several
callers speak in the same second, a plain first-come queue makes a caller whose turn has ended (and
who now waits for the answer) wait behind other calls' decodes of half-finished turns. Here every
decode carries a priority:

- `ENDED`: the caller stopped and waits for the agent: first;
- `PAUSED`: the caller paused, perhaps at the end of the turn (the decode that usually makes the
  answer ready before the turn ends);
- `PARTIAL`: a look at a turn still going on (barge-in over the agent): last.

Within a priority, first come first served. A decode still queued when its turn no longer needs it
(its future cancelled: the turn ended and another decode covers it) is skipped, so under load the
recognizer's time goes to what callers wait for.

`DecodeExecutor` is a `concurrent.futures.Executor`, used through `loop.run_in_executor`, so the
virtual clock of simulated calls still sees each decode as a running job. `CALLCENTER_DECODE_ORDER=
arrival` in a worker's environment runs decodes first come first served instead, to measure the
difference (`bench call --stagger-s 0`).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import queue
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

ENDED, PAUSED, PARTIAL = 0, 1, 2
DEFAULT_WORKERS = 2
STOP = 99  # after every decode still queued


@dataclass(frozen=True)
class Decode:
    """`fn` tagged with its priority, for `run_in_executor(executor, Decode(priority, fn), *args)`."""

    priority: int
    fn: Callable[..., Any]

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


class DecodeExecutor(concurrent.futures.Executor):
    def __init__(self, workers: int = DEFAULT_WORKERS, name: str = "decode"):
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count(1)
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()
        self.skipped = 0  # decodes cancelled before they ran
        self.by_arrival = os.environ.get("CALLCENTER_DECODE_ORDER", "urgent") == "arrival"

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        priority = PAUSED if self.by_arrival else getattr(fn, "priority", PAUSED)
        self._queue.put((priority, next(self._order), future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while True:
            _, _, future, fn, args, kwargs = self._queue.get()
            if future is None:
                return
            if not future.set_running_or_notify_cancel():
                self.skipped += 1
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to whoever awaits the decode
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._queue.put((STOP, next(self._order), None, None, (), {}))
        if wait:
            for t in self._threads:
                t.join()


_shared: "weakref.WeakKeyDictionary[Any, DecodeExecutor]" = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def decode_executor(stt) -> DecodeExecutor:
    """The one executor of every call that shares `stt` (one per process in a worker)."""
    with _shared_lock:
        executor = _shared.get(stt)
        if executor is None:
            executor = _shared[stt] = DecodeExecutor(getattr(stt, "workers", DEFAULT_WORKERS))
        return executor
