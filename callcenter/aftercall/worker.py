"""The post-call worker: when a call ends, its summary and webhook are made here, off the media
path. One call at a time per process, in a thread at the lowest CPU priority for the rules and the
store, so live calls never wait on it; the webhook's retries wait on the network, not on the CPU."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog

from callcenter.aftercall.fields import fill
from callcenter.aftercall.scorecard import score
from callcenter.aftercall.summary import summarise
from callcenter.aftercall.webhook import Webhook
from callcenter.store.calls import CallRecords

log = structlog.get_logger()

ROW_WAIT_S = 10.0  # the row's end is written by the outbox just after the call: wait for it this long
NICE = 19


@dataclass
class EndedCall:
    """A call that is over, as the post-call work gets it: its events as the JSONL holds them, its
    flow's `after_call:`, and its variables at the end (sensitive ones left out)."""
    call_id: str
    events: list[dict[str, Any]]
    after_call: Any = None
    variables: dict[str, Any] = field(default_factory=dict)


class PostCall:
    def __init__(self, calls: CallRecords, webhook: Webhook | None, scorecards: dict | None = None):
        self.calls, self.webhook = calls, webhook
        self.scorecards = scorecards or {}  # flow name -> Scorecard
        self.queue: asyncio.Queue[EndedCall] = asyncio.Queue()
        # its own thread, at the lowest priority: never one of the threads live calls use
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="post-call", initializer=_lower_priority)

    def call_ended(self, call_id: str, events: list[dict[str, Any]], after_call=None,
                   variables: dict[str, Any] | None = None) -> None:
        """A call is over: summarise it when the worker is free."""
        self.queue.put_nowait(EndedCall(call_id, events, after_call, variables or {}))

    async def run(self) -> None:
        while True:
            await self._one(await self.queue.get())

    async def drain(self, timeout_s: float) -> None:
        """At shutdown: the calls that ended last get their summary (and webhook) too, within timeout_s."""
        try:
            async with asyncio.timeout(timeout_s):
                while not self.queue.empty():
                    await self._one(self.queue.get_nowait())
        except TimeoutError:
            log.error("post_call_unfinished", calls=self.queue.qsize(), after_s=timeout_s)

    async def _one(self, ended: EndedCall) -> None:
        loop = asyncio.get_running_loop()
        try:
            payload = await loop.run_in_executor(self.executor, self._summarise, ended)
            if payload is not None and self.webhook is not None:
                await self.webhook.send(payload)
        except Exception:
            log.exception("post_call_failed", call_id=ended.call_id)

    def _summarise(self, ended: EndedCall) -> dict[str, Any] | None:
        call_id, events = ended.call_id, ended.events
        row = self._ended_row(call_id)
        if row is None:
            log.error("post_call_no_row", call_id=call_id, waited_s=ROW_WAIT_S)
            return None
        found = summarise(row, events)
        fields: dict[str, Any] = {}
        if ended.after_call is not None:
            fields, phrase_categories = fill(ended.after_call, ended.variables, row.get("outcome"), events)
            found.categories += [c for c in phrase_categories if c not in found.categories]
        self.calls.summarised(call_id, found.summary, found.categories, found.sentiment, fields)
        card = self.scorecards.get(row.get("flow") or "")
        scores = score(card, events) if card is not None and row.get("answered") else None
        if scores is not None:
            self.calls.scored(call_id, scores)
        log.info("call_summarised", call_id=call_id, categories=found.categories, sentiment=found.sentiment)
        return {"event": "call_ended", **{k: v for k, v in row.items() if k not in ("summary", "categories",
                                                                                   "sentiment", "after_call", "scores")},
                **found.as_dict(), "after_call": fields, **({"scores": scores} if scores else {})}

    def _ended_row(self, call_id: str) -> dict[str, Any] | None:
        deadline = time.monotonic() + ROW_WAIT_S
        while True:
            row = self.calls.get(call_id)
            if row is not None and row.get("ended"):
                return row
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)


def _lower_priority() -> None:
    """The post-call thread runs at the lowest CPU priority (Linux: niceness is per thread)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (OSError, AttributeError):
        pass
