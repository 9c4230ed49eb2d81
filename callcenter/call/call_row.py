"""The call's row in the store, written as the call starts and ends, off the media path: each write
runs in a worker thread, and a write the store refuses (PostgreSQL restarting) waits in the
server's `Outbox` and is written when the store answers again, in order, with nothing lost."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Callable

import structlog

from callcenter.store.calls import CallEnd, CallRecords
from callcenter.store.db import StoreError

log = structlog.get_logger()

RETRY_EVERY_S = 2.0


class Outbox:
    """Store writes that failed, retried in order until the store takes them."""

    def __init__(self) -> None:
        self._pending: deque[tuple[str, Callable[[], None]]] = deque()
        self._lock = threading.Lock()
        self.warned = False

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, what: str, write: Callable[[], None]) -> None:
        """Queue a write (cheap: call it on the loop, in the order the writes must land)."""
        with self._lock:
            self._pending.append((what, write))

    def retry(self) -> None:
        """Make the waiting writes now (in this thread), oldest first, so a call's end never lands
        before its start; what the store refuses waits for the next try."""
        with self._lock:
            self._drain()

    def _drain(self) -> None:
        while self._pending:
            what, write = self._pending[0]
            try:
                write()
            except StoreError as exc:
                if not self.warned:
                    log.warning("store_unavailable", error=str(exc), waiting=len(self._pending),
                                note="writes are kept and made when the store answers again")
                    self.warned = True
                return
            except Exception:
                log.exception("store_write_failed", what=what)  # a bad write is not retried for ever
            self._pending.popleft()
        if self.warned:
            log.warning("store_available_again")
            self.warned = False

    async def keep_retrying(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(RETRY_EVERY_S)
            if self._pending:
                await loop.run_in_executor(None, self.retry)


class CallRow:
    """One call's row: `started` when media flows, `ended` when the call is over."""

    def __init__(self, records: CallRecords, outbox: Outbox, call_id: str):
        self.records, self.outbox, self.call_id = records, outbox, call_id

    def _off_loop(self, what: str, write: Callable[[], None]) -> None:
        self.outbox.add(what, write)  # in order, here; written in a worker thread
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.outbox.retry()
            return
        loop.run_in_executor(None, self.outbox.retry)

    def started(self, **fields) -> None:
        self._off_loop("call_started", lambda: self.records.started(self.call_id, **fields))

    def ended(self, end: CallEnd) -> None:
        self._off_loop("call_ended", lambda: self.records.ended(self.call_id, end))
