"""The campaign dialer: one per fleet (the holder of the store's `dialer` lease), it dials the
running campaigns' due contacts in their calling windows, paced, and records each attempt's result.

- A contact's attempt is counted (`claim`) before its call is placed, so a crash between the two
  never dials it twice; an attempt found unfinished after a crash takes its call's row from the
  store, or counts as `failed` when the call never got one.
- The do-not-call list in the store is checked right before every call.
- Pacing is progressive: never more of a campaign's calls at once than `pace.max_concurrent`, nor
  more than the worker's free call slots, nor more than `pace.calls_per_second` new calls a second.
  A campaign whose flow hands people to agents (`pace.agents_queue`) places no more calls at once
  than that queue's free agents (less the callers already waiting for them); while its abandonment
  rate (people reached who then left the queue unanswered, over people reached) is above
  `pace.max_abandon_rate`, one call at a time, and only while an agent is free.
- Time: calling windows are judged on the campaign clock (`CALLCENTER_NOW` moves it, for tests and
  rehearsals); retry delays are seconds of real time."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import structlog

from callcenter.campaign.model import Schedule
from callcenter.errors import CallcenterError
from callcenter.store.calls import DNC_SKIPPED, FAILED, UNANSWERED
from callcenter.store.campaigns import DIALLING, PAUSED, CampaignStore, Contact
from callcenter.store.db import StoreError

log = structlog.get_logger()

LEASE = "dialer"
LEASE_S = 6.0  # a dialer silent this long loses the lease to another worker's
TICK_S = 0.5
UNFINISHED_GRACE_S = 30.0  # an attempt left `dialling` by a dead dialer: its call gets this long to end
NOW_ENV = "CALLCENTER_NOW"  # e.g. 2026-12-07T16:30:00+00:00: the campaign clock starts there
RETRIED = UNANSWERED  # results that are tried again while attempts remain
REFUSED = "refused"  # the server would not dial the contact (not allowed, bad variables): final


def campaign_clock() -> Callable[[], dt.datetime]:
    """Now, for calling windows: the wall clock, or `CALLCENTER_NOW` advancing in real time."""
    given = os.environ.get(NOW_ENV, "").strip()
    if not given:
        return lambda: dt.datetime.now(dt.timezone.utc)
    start = dt.datetime.fromisoformat(given)
    if start.tzinfo is None:
        raise ValueError(f"{NOW_ENV}={given!r}: give the time zone too, e.g. 2026-12-07T16:30:00+00:00")
    wall0 = time.time()
    return lambda: start + dt.timedelta(seconds=time.time() - wall0)


@dataclass
class Attempt:
    contact: Contact
    number: int
    call: Any  # the server's OutboundSipCall: `progress`, `outcome`, `call_id`


@dataclass
class Pacing:
    """At most `per_second` new calls a second: each at least 1/per_second after the one before."""
    per_second: float
    last: float = float("-inf")

    def may_dial(self, now: float) -> bool:
        return now - self.last >= 1.0 / self.per_second

    def dialled(self, now: float) -> None:
        self.last = now


Dial = Callable[[str, str, dict, str | None], Awaitable[Any]]


class Dialer:
    def __init__(self, store: CampaignStore, dial: Dial, free_slots: Callable[[], int], holder: str,
                 calls_row: Callable[[str], dict | None], clock: Callable[[], dt.datetime] | None = None,
                 callbacks=None):
        """`callbacks`: the queues' callbacks (`campaign/callbacks.py`), dialled by the same lease holder."""
        self.store, self.dial, self.free_slots, self.holder = store, dial, free_slots, holder
        self.callbacks = callbacks
        self.calls_row = calls_row  # a call's row in the store, by id (None: none yet)
        self.clock = clock or campaign_clock()
        self.in_flight: dict[str, Attempt] = {}
        self.pacing: dict[str, Pacing] = {}
        self.over_bound: dict[str, bool] = {}  # campaigns over their abandonment bound: one call at a time
        self.holding = False

    async def run(self) -> None:
        while True:
            try:
                await self._db(self._lease)
                if self.holding or self.in_flight:
                    await self.tick()
                if self.callbacks is not None:
                    await self.callbacks.tick(self.holding)
            except StoreError as exc:  # the store restarting: the dialer waits, nothing is lost
                log.warning("dialer_store_unavailable", error=str(exc))
            except Exception:
                log.exception("dialer_failed")
            await asyncio.sleep(TICK_S)

    def _lease(self) -> None:
        held = self.store.take_lease(LEASE, self.holder, LEASE_S)
        if held != self.holding:
            log.info("dialer_lease", held=held, holder=self.holder)
        self.holding = held

    @staticmethod
    async def _db(fn, *args):
        """The store off the event loop: live calls' audio never waits on it."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def tick(self) -> None:
        """Record the ended calls, settle what a dead dialer left, and dial what is due."""
        await self._db(self._collect)
        if not self.holding:
            return
        for campaign in await self._db(self.store.running):
            await self._db(self._recover, campaign)
            await self._dial_due(campaign)

    def _collect(self) -> None:
        for call_id, attempt in list(self.in_flight.items()):
            if attempt.call.progress == "ended":
                del self.in_flight[call_id]
                campaign = self.store.campaign(attempt.contact.campaign)
                self._record(campaign, attempt.contact, attempt.number, attempt.call.outcome or FAILED)

    def _record(self, campaign: dict, contact: Contact, number: int, result: str) -> None:
        settings = campaign["settings"]
        retry = None
        if result in RETRIED and number < settings["attempts"]:
            retry = time.time() + settings["retry_s"][result]
        self.store.attempted(contact, number, result, retry)
        log.info("campaign_attempt", campaign=contact.campaign, row=contact.row_no, attempt=number, result=result,
                 retry_in_s=round(retry - time.time(), 1) if retry else None)

    def _recover(self, campaign: dict) -> None:
        """Attempts another dialer (or this one before a restart) left unfinished."""
        mine = {a.contact.row_no for a in self.in_flight.values() if a.contact.campaign == campaign["name"]}
        for contact in self.store.contacts(campaign["name"], DIALLING):
            if contact.row_no in mine:
                continue
            row = self.calls_row(contact.call_id) if contact.call_id else None
            if row is not None and row.get("ended"):
                result = row["outcome"] or FAILED
            elif time.time() - contact.updated > UNFINISHED_GRACE_S:
                row, result = None, FAILED  # never placed, or its worker died before its row: counts as made
            else:
                continue
            answered = row is not None and bool(row.get("answered"))
            log.warning("campaign_attempt_recovered", campaign=contact.campaign, row=contact.row_no,
                        call_id=contact.call_id, result=result, answered=answered)
            if answered:  # a person was reached: final, whatever ended the call
                self.store.attempted(contact, contact.attempts, result, None)
            else:
                self._record(campaign, contact, contact.attempts, result if result in RETRIED else FAILED)

    def _for_agents(self, name: str, queue: str, pace: dict, busy: int) -> int:
        """Calls at once the agents of `queue` allow: one per free agent (less the callers already
        waiting for one); while the campaign's abandonment rate is over its bound, one at a time."""
        free, waiting = self.store.agents_free(queue)
        most = busy + max(0, free - waiting - busy)
        abandoned, persons = self.store.abandonment(name)
        if persons and abandoned / persons > pace.get("max_abandon_rate", 0.03):
            if not self.over_bound.get(name):
                log.warning("campaign_abandonment_bound", campaign=name, abandoned=abandoned, reached=persons)
            self.over_bound[name] = True
            return 1 if free > waiting else 0
        self.over_bound[name] = False
        return most

    async def _dial_due(self, campaign: dict) -> None:
        name, settings = campaign["name"], campaign["settings"]
        pace = self.pacing.setdefault(name, Pacing(settings["pace"]["calls_per_second"]))
        schedule = Schedule(settings)
        now = self.clock()
        busy = sum(1 for a in self.in_flight.values() if a.contact.campaign == name)
        most = settings["pace"]["max_concurrent"]
        queue = settings["pace"].get("agents_queue")
        if queue:
            most = min(most, await self._db(self._for_agents, name, queue, settings["pace"], busy))
        for contact in await self._db(self.store.due, name, time.time()):
            if busy >= most or self.free_slots() <= 0:
                return
            if not pace.may_dial(time.monotonic()):
                return
            if not schedule.open(contact.timezone, now):
                continue
            if await self._db(self.store.on_do_not_call, contact.number):
                await self._db(self.store.skipped, contact, DNC_SKIPPED)
                log.info("campaign_do_not_call", campaign=name, row=contact.row_no)
                continue
            attempt = await self._db(self.store.claim, contact)
            if attempt is None:
                continue
            pace.dialled(time.monotonic())
            try:
                call = await self.dial(contact.number, campaign["flow"], contact.variables, settings.get("caller_id"))
            except CallcenterError as exc:
                status = getattr(exc, "status", None)
                if status in (503, 404):  # no free slot after all, or no such flow here: not an attempt
                    await self._db(self.store.unclaim, contact, attempt)
                    if status == 404:  # the flow left the server config: stop, never refuse every contact
                        log.error("campaign_paused", campaign=name, error=str(exc))
                        await self._db(self.store.set_state, name, PAUSED)
                    return
                log.warning("campaign_contact_refused", campaign=name, row=contact.row_no, error=str(exc))
                await self._db(self.store.attempted, contact, attempt, REFUSED, None)
                continue
            await self._db(self.store.placed, contact, attempt, call.call_id)
            self.in_flight[call.call_id] = Attempt(contact, attempt, call)
            busy += 1
