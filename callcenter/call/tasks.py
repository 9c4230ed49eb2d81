"""The tasks of one call: its two loops (hearing, and carrying out the flow's actions), the flow's
stages (a webhook, a model turn), and short tasks (a turn's recognition, a key's decision). Every
one ends with the call; one that fails leaves a traceback and an `error` event, and the caller
hears the flow's trouble path, never silence."""

from __future__ import annotations

import asyncio

from callcenter.call import events as ev

SHUTDOWN_S = 1.0  # a stage still busy this long after the call ended is logged and left behind


class CallTasks:
    def __init__(self, call):
        self.call = call
        self._stages: list[asyncio.Task] = []  # the call's loops and stages: cancelled at its end
        self._side: set[asyncio.Task] = set()  # a turn's recognition, a key's decision: ended with the call

    def loop(self, run, name: str) -> None:
        """One of the call's loops (`hear`, `speak`): a crash takes the trouble path, and the
        speaking loop is started again."""
        task = asyncio.create_task(run(), name=f"{self.call.call_id}-{name}")
        task.add_done_callback(lambda t: self._loop_died(t, run, name))
        self._stages.append(task)

    def stage(self, coro) -> None:
        """A stage of the flow's (a webhook, a model turn): ended with the call."""
        self._stages.append(asyncio.create_task(coro))

    def keep(self, task: asyncio.Task) -> asyncio.Task:
        """Hold a short task of this call until it is done (the loop keeps only weak references), and
        cancel it if the call ends first."""
        call = self.call
        self._side.add(task)

        def done(t: asyncio.Task) -> None:
            self._side.discard(t)
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                # a traceback in the log, an error event, and the caller hears the flow's trouble
                # path rather than silence
                call.log.error("task_failed", task=t.get_name(), error=repr(exc), exc_info=exc)
                call.events.emit(ev.ERROR, stage="task", task=t.get_name(), error=repr(exc))
                call.trouble("task")

        task.add_done_callback(done)
        return task

    def _loop_died(self, task: asyncio.Task, run, name: str) -> None:
        """A hearing or speaking loop that crashes would leave the caller in dead air: restart the
        speaking loop if it was that one, and take the trouble path (with everything recorded so far
        kept). A second crash while in trouble ends the call."""
        call = self.call
        if task.cancelled() or task.exception() is None or call.ended.is_set():
            return
        exc = task.exception()
        call.log.error("stage_failed", task=task.get_name(), error=repr(exc))
        call.events.emit(ev.ERROR, stage=name, error=repr(exc))
        if call.in_trouble:
            call.end("error")
            return
        if name == "speak":
            call.speaking.queue = asyncio.Queue()
            self.loop(run, name)
        call.trouble(name)

    async def shutdown(self) -> None:
        for t in self._stages:
            if not t.done():
                t.cancel()
        busy = [t for t in self._stages if not t.done()]
        if busy:
            _, stuck = await asyncio.wait(busy, timeout=SHUTDOWN_S)
            for t in stuck:  # the call still ends now; the stage's stack says what it was waiting on
                frames = [f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno} {f.f_code.co_name}"
                          for f in t.get_stack()]
                self.call.log.error("stage_stuck_at_end", task=t.get_name(), stack=frames)
        for t in self._stages:
            if t.done() and not t.cancelled():
                t.exception()  # retrieved: a stage that failed while ending is not an unhandled error
        for t in list(self._side):
            t.cancel()
