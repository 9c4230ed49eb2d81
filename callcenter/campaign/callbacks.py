"""Calling back the callers who asked for it in a queue (customer first, as Amazon Connect's queued
callbacks): run by the fleet's dialer (the holder of the `dialer` lease), every tick.

- A callback is dialled when its place comes up: nobody who joined the queue earlier is waiting, and
  an agent of the queue is free (`CallbackStore.due`). Until then it holds its place: live callers
  who joined later wait behind it.
- The call says the queue's `callback_intro` and joins the queue at the caller's old place, so the
  free agent is rung for them at once, and the two are bridged as for any queued call.
- No answer, busy, a failed call or an answering machine: tried again after the queue's
  `callback_retry_s`, up to `callback_attempts` calls. The result is kept in the store.
- An attempt is counted before its call is placed; one a dead dialer left unfinished takes its
  call's row from the store, or counts as failed."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import structlog

from callcenter.errors import CallcenterError
from callcenter.store.callbacks import Callback, CallbackStore
from callcenter.store.calls import FAILED

log = structlog.get_logger()

UNFINISHED_GRACE_S = 30.0
DialCallback = Callable[[str, str, str], Awaitable[Any]]  # (number, flow, queue) -> the placed call


class CallbackDialer:
    def __init__(self, store: CallbackStore, dial: DialCallback, free_slots: Callable[[], int],
                 calls_row: Callable[[str], dict | None]):
        self.store, self.dial, self.free_slots, self.calls_row = store, dial, free_slots, calls_row
        self.in_flight: dict[str, tuple[Callback, Any]] = {}  # dialled call id -> (callback, call)

    @staticmethod
    async def _db(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def tick(self, holding: bool) -> None:
        await self._db(self._collect)
        if not holding:
            return
        await self._db(self._recover)
        for cb in await self._db(self.store.due):
            if self.free_slots() <= 0:
                return
            attempt = await self._db(self.store.claim, cb)
            if attempt is None:
                continue
            try:
                call = await self.dial(cb.number, cb.flow, cb.queue)
            except CallcenterError as exc:
                if getattr(exc, "status", None) == 503:  # no free slot after all: not an attempt
                    await self._db(self.store.unclaim, cb, attempt)
                    return
                # not placed (502): tried again like a failed call; refused by the config: final
                result = FAILED if getattr(exc, "status", None) == 502 else "refused"
                state = await self._db(self.store.finished, cb.call_id, result)
                log.warning("callback_refused", call_id=cb.call_id, queue=cb.queue, error=str(exc), state=state)
                continue
            await self._db(self.store.placed, cb, call.call_id)
            self.in_flight[call.call_id] = (cb, call)
            log.info("callback_dialled", call_id=cb.call_id, queue=cb.queue, attempt=attempt, dial_call_id=call.call_id)

    def _collect(self) -> None:
        for dial_id, (cb, call) in list(self.in_flight.items()):
            if call.progress == "ended":
                del self.in_flight[dial_id]
                result = call.outcome or FAILED
                state = self.store.finished(cb.call_id, result)
                log.info("callback_attempt", call_id=cb.call_id, queue=cb.queue, result=result, state=state)

    def _recover(self) -> None:
        mine = {cb.call_id for cb, _ in self.in_flight.values()}
        for cb in self.store.unfinished(UNFINISHED_GRACE_S):
            if cb.call_id in mine:
                continue
            row = self.calls_row(cb.dial_call_id) if cb.dial_call_id else None
            if row is not None and not row.get("ended"):
                continue  # its call is still going on another worker
            result = (row or {}).get("outcome") or FAILED
            state = self.store.finished(cb.call_id, result)
            log.warning("callback_attempt_recovered", call_id=cb.call_id, dial_call_id=cb.dial_call_id,
                        result=result, state=state)
