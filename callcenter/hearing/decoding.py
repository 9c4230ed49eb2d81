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
recognizer's time goes to what callers wait for. So is one whose `wanted()` says no when its turn
comes (a pause decode of a caller who has gone on talking since).

A decode may name its `stream` (the session names the call and the turn). A newer decode of the
same stream covers more of the turn, so it **replaces** one of that stream still in the queue: the
old one's future is cancelled, and the new one takes its place in the queue, unless it is more
urgent than that place (then it queues at its own priority). A caller who pauses three times in a
sentence while eleven other callers talk costs one decode, not three, and does not go to the back
of the queue each time. When the turn ends and its caller waits for that decode, `hurry()` moves it
up among the ended turns.

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
from typing import Any, Callable, Hashable

ENDED, PAUSED, PARTIAL = 0, 1, 2
DEFAULT_WORKERS = 2
MAX_DEFAULT_THREADS = 4  # decodes at once that a process takes by itself; more only when configured
STOP = 99  # after every decode still queued


@dataclass(frozen=True)
class Decode:
    """`fn` tagged with its priority, for `run_in_executor(executor, Decode(priority, fn), *args)`."""

    priority: int
    fn: Callable[..., Any]
    stream: Hashable | None = None  # a later decode of the same stream replaces this one while queued
    wanted: Callable[[], bool] | None = None  # asked just before it runs: False, and it is skipped

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


class _Job:
    __slots__ = ("future", "fn", "args", "kwargs")

    def __init__(self, future, fn, args, kwargs):
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs


class DecodeExecutor(concurrent.futures.Executor):
    def __init__(self, workers: int = DEFAULT_WORKERS, name: str = "decode"):
        # entries are [priority, order, job, stream]: the order is unique, so a job is never compared;
        # a queued entry's job is swapped for its replacement, and set to None when a worker takes it
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count(1)
        self._lock = threading.Lock()
        self._queued: dict[Hashable, list] = {}  # stream -> its entry still in the queue
        self._running = 0
        self.skipped = 0  # decodes cancelled before they ran
        self.replaced = 0  # ...of them, replaced by a later decode of the same stream
        self.by_arrival = os.environ.get("CALLCENTER_DECODE_ORDER", "urgent") == "arrival"
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        priority = PAUSED if self.by_arrival else getattr(fn, "priority", PAUSED)
        stream = getattr(fn, "stream", None)
        job = _Job(future, fn, args, kwargs)
        with self._lock:
            old = self._queued.get(stream) if stream is not None else None
            if old is not None and old[2] is not None:
                self.skipped += 1
                if not old[2].future.cancelled():  # (the session cancels what it no longer needs itself)
                    old[2].future.cancel()
                    self.replaced += 1
                if priority >= old[0]:  # its place in the queue is as urgent: take it
                    old[2] = job
                    return future
                old[2] = None
            self._put(priority, job, stream)
        return future

    def _put(self, priority: int, job: _Job, stream: Hashable | None) -> None:
        """Queue `job` (with the lock held), as its stream's decode still queued."""
        entry = [priority, next(self._order), job, stream]
        if stream is not None:
            self._queued[stream] = entry
        self._queue.put(entry)

    def hurry(self, stream: Hashable) -> None:
        """The stream's decode still queued is now awaited by a caller whose turn has ended: it
        runs with the ended turns."""
        with self._lock:
            entry = self._queued.get(stream)
            if entry is None or entry[2] is None or entry[0] <= ENDED:
                return
            job, entry[2] = entry[2], None
            self._put(ENDED, job, stream)

    def _work(self) -> None:
        while True:
            entry = self._queue.get()
            with self._lock:
                job, entry[2] = entry[2], None
                if self._queued.get(entry[3]) is entry:
                    del self._queued[entry[3]]
            if entry[0] == STOP:
                return
            if job is None:  # replaced by a more urgent decode of its stream, queued on its own
                continue
            wanted = getattr(job.fn, "wanted", None)
            if wanted is not None and not wanted():
                job.future.cancel()
            if not job.future.set_running_or_notify_cancel():
                self.skipped += 1
                continue
            with self._lock:
                self._running += 1
            result = error = None
            try:
                result = job.fn(*job.args, **job.kwargs)
            except BaseException as exc:  # handed to whoever awaits the decode
                error = exc
            with self._lock:  # not busy with it before anyone hears it is done
                self._running -= 1
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)

    @property
    def busy(self) -> bool:
        """A decode is running or waiting."""
        return self._running > 0 or not self._queue.empty()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._queue.put([STOP, next(self._order), None, None])
        if wait:
            for t in self._threads:
                t.join()


def default_threads(processes: int = 1) -> int:
    """Decodes a process runs at once when its config does not say (`decode_threads`): one per core
    it can count on, the cores shared among the agent processes of the machine, at least one. Twelve
    callers in the same second on 2 cores, 3 processes: with 2 decode threads each (6 decodes sharing
    2 cores, all of them slow) voice-to-voice p95 was 834 ms; with one each, 680 ms (one run each,
    `bench call --workers 3 --concurrent 12 --stagger-s 0`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_DEFAULT_THREADS, cores // max(1, processes)))


_shared: "weakref.WeakKeyDictionary[Any, DecodeExecutor]" = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def decode_executor(stt) -> DecodeExecutor:
    """The one executor of every call that shares `stt` (one per process in a worker)."""
    with _shared_lock:
        executor = _shared.get(stt)
        if executor is None:
            executor = _shared[stt] = DecodeExecutor(getattr(stt, "workers", DEFAULT_WORKERS))
        return executor
