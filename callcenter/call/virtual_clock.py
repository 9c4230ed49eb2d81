"""An asyncio event loop on a virtual clock, for simulated calls (`simulate --fast`, audio
scenarios): whenever nothing can happen but waiting, the clock jumps to the next timer, so a 60 s
call runs in the few seconds its computation takes, with the same events and decisions.

Nothing can happen but waiting when no callback is ready, no job is running on an executor (the
recognizer, the voice), and no socket has anything to read right now (a loopback web server, in
this loop, answers within the same instant). While a job runs, the clock stands still: a decode
takes no time on the virtual clock. A service outside this process (a remote model or webhook)
answers later than the virtual clock expects; simulate those calls in real time."""

from __future__ import annotations

import asyncio


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._virtual = 0.0
        self._jobs = 0

    def time(self) -> float:
        return self._virtual

    def run_in_executor(self, executor, func, *args):
        future = super().run_in_executor(executor, func, *args)
        self._jobs += 1

        def finished(_):
            self._jobs -= 1

        future.add_done_callback(finished)
        return future

    def _run_once(self) -> None:  # asyncio's own step, with the clock moved first when all is idle
        if not self._ready and not self._jobs and not self._stopping and self._scheduled:
            events = self._selector.select(0)
            if events:
                self._process_events(events)
            if not self._ready:
                due = min((h._when for h in self._scheduled if not h._cancelled), default=None)
                if due is not None and due > self._virtual:
                    self._virtual = due
        super()._run_once()


def run_virtual(coro):
    """asyncio.run on the virtual clock."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(coro)
