"""A queue of human agents without a store or phones, for `callcenter simulate` and flow scenarios:
an agent answers after a set time, or nobody ever comes, or the caller presses the callback key.
It stands where `QueueWait` stands (the same `start`, `result`, `position`, `leave` and `agent`), so
the flow's queue paths run offline exactly as on a live call: answered, timed out, called back."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from callcenter.call import events as ev

DEFAULT_AGENT = "agent"


class QueueScript(BaseModel):
    """How a simulated queue behaves (a scenario's `queue:`)."""
    model_config = ConfigDict(extra="forbid")
    answers_after_s: float | None = Field(0.0, ge=0, description="An agent answers after this long; null: nobody "
                                                                 "ever comes (the queue's max_wait_s runs out).")
    agent: str = Field(DEFAULT_AGENT, description="The name of the agent who answers.")
    callback_after_s: float | None = Field(None, ge=0, description="The caller presses the queue's callback key "
                                                                   "after this long (if the queue offers one).")

    def outcome(self, max_wait_s: float, callback_key: str | None) -> tuple[str, float]:
        """(answered | timeout | callback, after how many seconds)."""
        answer = self.answers_after_s if self.answers_after_s is not None else float("inf")
        if callback_key and self.callback_after_s is not None and self.callback_after_s < min(answer, max_wait_s):
            return "callback", self.callback_after_s
        if answer <= max_wait_s:
            return "answered", answer
        return "timeout", max_wait_s


@dataclass(frozen=True)
class SimulatedAgent:
    name: str
    uri: str


class SimulatedQueueWait:
    def __init__(self, queue: str, settings, script: QueueScript, events=None):
        self.queue, self.settings, self.script, self.events = queue, settings, script, events
        self.result: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.agent: SimulatedAgent | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> "SimulatedQueueWait":
        self._emit(what="joined", queue=self.queue)
        result, after = self.script.outcome(self.settings.max_wait_s, self.settings.callback_key)
        if result == "answered":
            self._timer = asyncio.get_running_loop().call_later(after, self._answered)
        elif result == "callback":
            self._timer = asyncio.get_running_loop().call_later(after, self.leave, "callback")
        # timeout: the session's own max_wait_s ends the wait
        return self

    def _answered(self) -> None:
        if not self.result.done():
            self.agent = SimulatedAgent(self.script.agent, f"sip:{self.script.agent}@simulated")
            self._emit(what="answered", queue=self.queue, agent=self.script.agent)
            self.result.set_result("answered")

    def position(self) -> tuple[int, int, float]:
        answer = self.script.answers_after_s
        return 1, 1, float(answer if answer is not None else self.settings.max_wait_s)

    def leave(self, kind: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.result.done():
            self._emit(what="left", queue=self.queue, why=kind)
            self.result.set_result(kind)

    def _emit(self, **data) -> None:
        if self.events is not None:
            self.events.emit(ev.QUEUE, **data)
