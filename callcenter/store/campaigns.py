"""Outbound campaigns in the store: each campaign, its contacts (one row each, with its attempts
and its one final result), every attempt made, the do-not-call list, and the lease that lets one
dialer in the fleet dial at a time.

A contact is `pending` (due at `next_at`), `dialling` (an attempt is claimed: counted before the
call is placed, so a crash can never make it twice), or `done` with its result. Every write is one
transaction."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from callcenter.store.calls import QUEUE_ABANDONED, QUEUE_TIMEOUT
from callcenter.store.db import Database
from callcenter.store.queues import free_agents
from callcenter.store.workers import WORKER_STALE_S

PENDING, DIALLING, DONE = "pending", "dialling", "done"
RUNNING, PAUSED, FINISHED = "running", "paused", "finished"
CAMPAIGN_STATES = (RUNNING, PAUSED, FINISHED)
# final results that are not a person reached, as `summary` counts them (any other result is answered)
NOT_ANSWERED = ("machine", "no_answer", "busy", "failed", "dnc_skipped", "refused")
# a person reached, then left waiting for an agent: what the campaign's abandonment rate counts
ABANDONED_FOR_AGENTS = (QUEUE_ABANDONED, QUEUE_TIMEOUT)


class CampaignStoreError(ValueError):
    pass


@dataclass(frozen=True)
class Contact:
    campaign: str
    row_no: int
    number: str
    timezone: str
    variables: dict[str, str]
    attempts: int
    next_at: float
    state: str
    result: str | None
    call_id: str | None
    updated: float


CAMPAIGN_KEYS = ("name", "file", "flow", "state", "settings", "created", "updated")
CONTACT_COLUMNS = "campaign, row_no, number, timezone, variables, attempts, next_at, state, result, call_id, updated"


def _contact(row: tuple) -> Contact:
    values = list(row)
    values[4] = json.loads(values[4] or "{}")
    return Contact(*values)


class CampaignStore:
    def __init__(self, db: Database, clock=time.time):
        self.db, self.clock = db, clock

    # ---- campaigns
    def create(self, name: str, file: str, flow: str, settings: dict[str, Any],
               contacts: list[tuple[str, str, dict[str, str]]], do_not_call: list[str] = ()) -> None:
        """A new campaign with its contacts (number, time zone, variables), running at once."""
        now = self.clock()
        with self.db.transaction():
            if self.db.execute("SELECT 1 FROM campaigns WHERE name=?", (name,)):
                raise CampaignStoreError(f"campaign {name!r} exists already: pause, resume or see its status")
            self.db.execute("INSERT INTO campaigns(name, file, flow, state, settings, created, updated) "
                            "VALUES(?, ?, ?, ?, ?, ?, ?)", (name, file, flow, RUNNING, json.dumps(settings), now, now))
            for i, (number, zone, variables) in enumerate(contacts, 1):
                self.db.execute("INSERT INTO campaign_contacts(campaign, row_no, number, timezone, variables, updated) "
                                "VALUES(?, ?, ?, ?, ?, ?)", (name, i, number, zone, json.dumps(variables), now))
            for number in do_not_call:
                self._add_do_not_call(number, f"campaign {name}")

    def campaign(self, name: str) -> dict[str, Any]:
        found = self._campaigns("name=?", (name,))
        if not found:
            raise CampaignStoreError(f"no campaign {name!r}")
        return found[0]

    def running(self) -> list[dict[str, Any]]:
        return self._campaigns("state=?", (RUNNING,))

    def _campaigns(self, where: str, args: tuple) -> list[dict[str, Any]]:
        rows = self.db.execute(f"SELECT {', '.join(CAMPAIGN_KEYS)} FROM campaigns WHERE {where} ORDER BY created",
                               args)
        return [{**dict(zip(CAMPAIGN_KEYS, r)), "settings": json.loads(r[CAMPAIGN_KEYS.index("settings")])}
                for r in rows]

    def set_state(self, name: str, state: str) -> None:
        if state not in CAMPAIGN_STATES:
            raise CampaignStoreError(f"unknown campaign state {state!r}")
        with self.db.transaction():
            current = self.campaign(name)["state"]
            if current == FINISHED and state != FINISHED:
                raise CampaignStoreError(f"campaign {name!r} is finished: every contact has its result")
            self.db.execute("UPDATE campaigns SET state=?, updated=? WHERE name=?", (state, self.clock(), name))

    # ---- contacts
    def contacts(self, campaign: str, state: str | None = None) -> list[Contact]:
        sql = f"SELECT {CONTACT_COLUMNS} FROM campaign_contacts WHERE campaign=?"
        args: tuple = (campaign,)
        if state is not None:
            sql, args = sql + " AND state=?", (campaign, state)
        return [_contact(r) for r in self.db.execute(sql + " ORDER BY row_no", args)]

    def due(self, campaign: str, now: float, limit: int = 50) -> list[Contact]:
        rows = self.db.execute(f"SELECT {CONTACT_COLUMNS} FROM campaign_contacts WHERE campaign=? AND state=? "
                               "AND next_at <= ? ORDER BY next_at, row_no LIMIT ?", (campaign, PENDING, now, limit))
        return [_contact(r) for r in rows]

    def claim(self, contact: Contact) -> int | None:
        """Count the next attempt of a pending contact before it is dialled; its number, or None if
        another dialer claimed it first."""
        now = self.clock()
        with self.db.transaction():
            rows = self.db.execute("SELECT attempts, state FROM campaign_contacts WHERE campaign=? AND row_no=?",
                                   (contact.campaign, contact.row_no))
            if not rows or rows[0][1] != PENDING:
                return None
            attempt = rows[0][0] + 1
            self.db.execute("UPDATE campaign_contacts SET attempts=?, state=?, call_id=NULL, updated=? "
                            "WHERE campaign=? AND row_no=?", (attempt, DIALLING, now, contact.campaign, contact.row_no))
            self.db.execute("INSERT INTO campaign_attempts(campaign, row_no, attempt, started) VALUES(?, ?, ?, ?)",
                            (contact.campaign, contact.row_no, attempt, now))
            return attempt

    def unclaim(self, contact: Contact, attempt: int) -> None:
        """The claimed attempt was never placed (no free call slot): it does not count."""
        with self.db.transaction():
            self.db.execute("DELETE FROM campaign_attempts WHERE campaign=? AND row_no=? AND attempt=?",
                            (contact.campaign, contact.row_no, attempt))
            self.db.execute("UPDATE campaign_contacts SET attempts=?, state=?, updated=? WHERE campaign=? AND row_no=?",
                            (attempt - 1, PENDING, self.clock(), contact.campaign, contact.row_no))

    def placed(self, contact: Contact, attempt: int, call_id: str) -> None:
        with self.db.transaction():
            self.db.execute("UPDATE campaign_contacts SET call_id=?, updated=? WHERE campaign=? AND row_no=?",
                            (call_id, self.clock(), contact.campaign, contact.row_no))
            self.db.execute("UPDATE campaign_attempts SET call_id=? WHERE campaign=? AND row_no=? AND attempt=?",
                            (call_id, contact.campaign, contact.row_no, attempt))

    def attempted(self, contact: Contact, attempt: int, result: str, retry_at: float | None) -> None:
        """An attempt's result: the contact is due again at `retry_at`, or done with `result`."""
        with self.db.transaction():
            self.db.execute("UPDATE campaign_attempts SET result=? WHERE campaign=? AND row_no=? AND attempt=?",
                            (result, contact.campaign, contact.row_no, attempt))
            if retry_at is None:
                self.db.execute("UPDATE campaign_contacts SET state=?, result=?, updated=? WHERE campaign=? AND "
                                "row_no=?", (DONE, result, self.clock(), contact.campaign, contact.row_no))
            else:
                self.db.execute("UPDATE campaign_contacts SET state=?, result=?, next_at=?, updated=? WHERE "
                                "campaign=? AND row_no=?", (PENDING, result, retry_at, self.clock(), contact.campaign,
                                                            contact.row_no))
            self._finish_if_done(contact.campaign)

    def skipped(self, contact: Contact, result: str) -> None:
        """A contact given its final result without a call (on the do-not-call list, refused)."""
        with self.db.transaction():
            self.db.execute("UPDATE campaign_contacts SET state=?, result=?, updated=? WHERE campaign=? AND row_no=?",
                            (DONE, result, self.clock(), contact.campaign, contact.row_no))
            self._finish_if_done(contact.campaign)

    def _finish_if_done(self, campaign: str) -> None:
        left = self.db.execute("SELECT COUNT(*) FROM campaign_contacts WHERE campaign=? AND state != ?",
                               (campaign, DONE))
        if left and left[0][0] == 0:
            self.db.execute("UPDATE campaigns SET state=?, updated=? WHERE name=?", (FINISHED, self.clock(), campaign))

    def attempts(self, campaign: str) -> list[tuple[int, int, str | None, str | None]]:
        """(row, attempt, call id, result) of every attempt made, in order."""
        return [tuple(r) for r in self.db.execute("SELECT row_no, attempt, call_id, result FROM campaign_attempts "
                                                   "WHERE campaign=? ORDER BY row_no, attempt", (campaign,))]

    def summary(self, name: str) -> dict[str, Any]:
        """The campaign (without its settings) and its counts: contacts, dialled, calls made,
        answered by a person, each not-answered result, remaining."""
        campaign = {k: v for k, v in self.campaign(name).items() if k != "settings"}
        rows = self.db.execute("SELECT state, result, attempts FROM campaign_contacts WHERE campaign=?", (name,))
        calls = self.db.execute("SELECT COUNT(*) FROM campaign_attempts WHERE campaign=?", (name,))[0][0]
        done = [result for state, result, _ in rows if state == DONE]
        abandoned, persons = self.abandonment(name)
        counts = {"contacts": len(rows), "dialled": sum(1 for *_, attempts in rows if attempts), "calls": calls,
                  "abandoned": abandoned, "abandon_rate": round(abandoned / persons, 4) if persons else None,
                  "answered": sum(1 for r in done if r not in NOT_ANSWERED),
                  **{r: sum(1 for d in done if d == r) for r in NOT_ANSWERED}, "remaining": len(rows) - len(done)}
        return {**campaign, "counts": counts}

    def abandonment(self, name: str) -> tuple[int, int]:
        """(people reached who then left a queue of agents unanswered, people reached), over every
        attempt of the campaign."""
        results = [r for (r,) in self.db.execute("SELECT result FROM campaign_attempts WHERE campaign=? AND "
                                                 "result IS NOT NULL", (name,))]
        persons = [r for r in results if r not in NOT_ANSWERED]
        return sum(1 for r in persons if r in ABANDONED_FOR_AGENTS), len(persons)

    def agents_free(self, queue: str) -> tuple[int, int]:
        """(agents of `queue` free now, callers waiting in it on live workers)."""
        now = self.clock()
        free = free_agents(self.db, queue, now)
        waiting = self.db.execute("SELECT COUNT(*) FROM callers c JOIN workers w ON c.worker = w.worker "
                                  "WHERE c.queue=? AND c.state='waiting' AND w.seen >= ?",
                                  (queue, now - WORKER_STALE_S))[0][0]
        return free, int(waiting or 0)

    def summaries(self) -> list[dict[str, Any]]:
        """Every campaign's summary, the newest first."""
        return [self.summary(n) for (n,) in self.db.execute("SELECT name FROM campaigns ORDER BY created DESC")]

    # ---- do not call
    def add_do_not_call(self, number: str, source: str = "") -> None:
        with self.db.transaction():
            self._add_do_not_call(number, source)

    def _add_do_not_call(self, number: str, source: str) -> None:
        self.db.execute("INSERT INTO do_not_call(number, added, source) VALUES(?, ?, ?) ON CONFLICT(number) DO NOTHING",
                        (number, self.clock(), source))

    def on_do_not_call(self, number: str) -> bool:
        return bool(self.db.execute("SELECT 1 FROM do_not_call WHERE number=?", (number,)))

    # ---- the fleet's one dialer
    def take_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Hold (or keep) the lease `name` for `ttl_s`: True for its holder, False while another holds it."""
        now = self.clock()
        with self.db.transaction():
            rows = self.db.execute("SELECT holder, until FROM leases WHERE name=?", (name,))
            if rows and rows[0][0] != holder and rows[0][1] > now:
                return False
            self.db.execute("INSERT INTO leases(name, holder, until) VALUES(?, ?, ?) ON CONFLICT(name) DO UPDATE "
                            "SET holder=excluded.holder, until=excluded.until", (name, holder, now + ttl_s))
            return True
