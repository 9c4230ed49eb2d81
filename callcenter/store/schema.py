"""The store's schema, one version at a time. Every worker applies what is missing when it starts,
under the store's lock, so one migrator runs at a time and the others find the work done;
`callcenter store migrate` does the same by hand and `callcenter store check` says whether any is
pending. A migration only adds (tables, columns, indexes): an older worker keeps running beside a
newer one during a rolling upgrade.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from callcenter.store.db import Database

VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied {real} NOT NULL)"""

QUEUES = """
CREATE TABLE IF NOT EXISTS agents (
    name TEXT PRIMARY KEY, uri TEXT NOT NULL, skills TEXT NOT NULL DEFAULT '[]',
    state TEXT NOT NULL DEFAULT 'logged_out', reason TEXT NOT NULL DEFAULT '', since {real} NOT NULL,
    idle_since {real} NOT NULL DEFAULT 0, last_rung {real} NOT NULL DEFAULT 0, wrap_until {real} NOT NULL DEFAULT 0,
    call_id TEXT, worker TEXT, retry_after {real} NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS callers (
    call_id TEXT PRIMARY KEY, queue TEXT NOT NULL, worker TEXT NOT NULL, joined {real} NOT NULL,
    state TEXT NOT NULL DEFAULT 'waiting', tried TEXT NOT NULL DEFAULT '[]');
CREATE INDEX IF NOT EXISTS callers_queue ON callers(queue, joined);
CREATE TABLE IF NOT EXISTS workers (worker TEXT PRIMARY KEY, pid INTEGER, seen {real} NOT NULL,
    free_slots INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY, members TEXT NOT NULL, skills TEXT NOT NULL,
    strategy TEXT NOT NULL, service_level_s {real} NOT NULL);
CREATE TABLE IF NOT EXISTS queue_log (t {real} NOT NULL, queue TEXT NOT NULL, call_id TEXT, agent TEXT,
    kind TEXT NOT NULL, wait_s {real}, talk_s {real});
CREATE INDEX IF NOT EXISTS queue_log_t ON queue_log(t)
"""

CALLS = """
CREATE TABLE IF NOT EXISTS calls (
    call_id TEXT PRIMARY KEY, direction TEXT NOT NULL DEFAULT 'inbound', transport TEXT NOT NULL DEFAULT 'sip',
    caller TEXT NOT NULL DEFAULT '', caller_number TEXT NOT NULL DEFAULT '',
    started {real} NOT NULL, answered {real}, ended {real},
    worker TEXT NOT NULL DEFAULT '', host TEXT NOT NULL DEFAULT '',
    flow TEXT NOT NULL DEFAULT '', flow_version INTEGER,
    nodes TEXT NOT NULL DEFAULT '[]', intent TEXT, slots TEXT NOT NULL DEFAULT '{}',
    outcome TEXT, transfer_to TEXT, queue TEXT, queue_wait_s {real},
    turns INTEGER NOT NULL DEFAULT 0, voice_to_voice_p50_ms {real}, voice_to_voice_max_ms {real},
    recording TEXT, events TEXT);
CREATE INDEX IF NOT EXISTS calls_started ON calls(started);
CREATE INDEX IF NOT EXISTS calls_outcome ON calls(outcome, started);
ALTER TABLE workers ADD COLUMN host TEXT NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN version TEXT NOT NULL DEFAULT ''
"""


def _retry_after(db: Database) -> None:
    """Stores made before agents had a retry time (queues.db of 2026-12-05 and older)."""
    if db.dialect == "sqlite":
        columns = {row[1] for row in db.execute("PRAGMA table_info(agents)")}
        if "retry_after" not in columns:
            db.execute("ALTER TABLE agents ADD COLUMN retry_after REAL NOT NULL DEFAULT 0")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    after: Callable[[Database], None] | None = None


FLEET = """
ALTER TABLE workers ADD COLUMN control TEXT NOT NULL DEFAULT ''
"""

CAMPAIGNS = """
CREATE TABLE IF NOT EXISTS campaigns (
    name TEXT PRIMARY KEY, file TEXT NOT NULL DEFAULT '', flow TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'running',
    settings TEXT NOT NULL DEFAULT '{}', created {real} NOT NULL, updated {real} NOT NULL);
CREATE TABLE IF NOT EXISTS campaign_contacts (
    campaign TEXT NOT NULL, row_no INTEGER NOT NULL, number TEXT NOT NULL, timezone TEXT NOT NULL,
    variables TEXT NOT NULL DEFAULT '{}', attempts INTEGER NOT NULL DEFAULT 0, next_at {real} NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'pending', result TEXT, call_id TEXT, updated {real} NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign, row_no));
CREATE INDEX IF NOT EXISTS campaign_contacts_due ON campaign_contacts(campaign, state, next_at);
CREATE TABLE IF NOT EXISTS campaign_attempts (
    campaign TEXT NOT NULL, row_no INTEGER NOT NULL, attempt INTEGER NOT NULL, call_id TEXT,
    started {real} NOT NULL, result TEXT, PRIMARY KEY (campaign, row_no, attempt));
CREATE TABLE IF NOT EXISTS do_not_call (number TEXT PRIMARY KEY, added {real} NOT NULL, source TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, until {real} NOT NULL)
"""

AFTER_CALL = """
ALTER TABLE calls ADD COLUMN summary TEXT;
ALTER TABLE calls ADD COLUMN categories TEXT NOT NULL DEFAULT '[]';
ALTER TABLE calls ADD COLUMN sentiment TEXT;
CREATE TABLE IF NOT EXISTS webhook_dead_letters (
    call_id TEXT NOT NULL, url TEXT NOT NULL, attempts INTEGER NOT NULL, error TEXT NOT NULL,
    payload TEXT NOT NULL, failed {real} NOT NULL);
CREATE INDEX IF NOT EXISTS webhook_dead_letters_failed ON webhook_dead_letters(failed)
"""

CALLBACKS = """
CREATE TABLE IF NOT EXISTS callbacks (
    call_id TEXT PRIMARY KEY, queue TEXT NOT NULL, number TEXT NOT NULL, flow TEXT NOT NULL,
    joined {real} NOT NULL, requested {real} NOT NULL, state TEXT NOT NULL DEFAULT 'waiting',
    attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL DEFAULT 3, retry_s {real} NOT NULL DEFAULT 300,
    next_try {real} NOT NULL DEFAULT 0, result TEXT, dial_call_id TEXT, updated {real} NOT NULL);
CREATE INDEX IF NOT EXISTS callbacks_due ON callbacks(state, next_try)
"""

AFTER_CALL_FIELDS = """
ALTER TABLE calls ADD COLUMN after_call TEXT NOT NULL DEFAULT '{}';
ALTER TABLE calls ADD COLUMN scores TEXT NOT NULL DEFAULT '{}'
"""

MIGRATIONS = (
    Migration(1, "queues and agents", QUEUES, _retry_after),
    Migration(2, "one row per call; workers' host and version", CALLS),
    Migration(3, "workers' control API, for the console to find the fleet", FLEET),
    Migration(4, "outbound campaigns, their contacts and attempts; do-not-call; leases", CAMPAIGNS),
    Migration(5, "after the call: summary, categories and sentiment; the webhook's dead letters", AFTER_CALL),
    Migration(6, "queued callbacks that dial, keeping the caller's place", CALLBACKS),
    Migration(7, "the flow's own after-call fields and the scorecard's scores on each call's row", AFTER_CALL_FIELDS),
)
LATEST = MIGRATIONS[-1].version


def current_version(db: Database) -> int:
    """The schema version the store is at (0: empty, or a queue store from before versions)."""
    db.execute(VERSION_TABLE)
    rows = db.execute("SELECT MAX(version) FROM schema_version")
    return int(rows[0][0] or 0) if rows else 0


def pending(db: Database) -> list[Migration]:
    return [m for m in MIGRATIONS if m.version > current_version(db)]


def migrate(db: Database) -> list[Migration]:
    """Apply every missing migration, in one exclusive transaction; returns those applied."""
    with db.transaction():
        todo = pending(db)
        for m in todo:
            _apply(db, m)
            db.execute("INSERT INTO schema_version(version, name, applied) VALUES(?, ?, ?)", (m.version, m.name, time.time()))
    return todo


def _apply(db: Database, m: Migration) -> None:
    for statement in (s.strip() for s in m.sql.split(";")):
        if not statement:
            continue
        if statement.upper().startswith("ALTER TABLE") and _has_column(db, statement):
            continue  # a column an earlier version of the same migration already added
        db.execute(statement)
    if m.after is not None:
        m.after(db)


def _has_column(db: Database, alter: str) -> bool:
    words = alter.split()
    table, column = words[2], words[5]
    if db.dialect == "sqlite":
        return column in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    return bool(db.execute("SELECT 1 FROM information_schema.columns WHERE table_name=? AND column_name=?",
                           (table, column)))
