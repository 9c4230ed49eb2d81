"""A queue store from before `store:` (`<recordings>/queues.db`, where the retention purge could
reach it) is adopted at the first start: its agents, queues and queue log are copied into the store,
and the old file is renamed `queues.db.adopted` so that it is copied once. Nothing is lost: the copy
and the rename happen under the store's lock, and a row the store already has is kept."""

from __future__ import annotations

from pathlib import Path

import structlog

from callcenter.store.db import Database, open_database
from callcenter.store.schema import migrate

log = structlog.get_logger()

LEGACY_FILE = "queues.db"
ADOPTED_SUFFIX = ".adopted"
TABLES = {  # table: its columns (as of schema version 1) and the key a copied row must not collide on
    "agents": ("name, uri, skills, state, reason, since, idle_since, last_rung, wrap_until, call_id, worker, "
               "retry_after", "name"),
    "queues": ("name, members, skills, strategy, service_level_s", "name"),
    "queue_log": ("t, queue, call_id, agent, kind, wait_s, talk_s", None),
}


def adopt_legacy_store(db: Database, recordings: Path) -> int:
    """Copy `<recordings>/queues.db` into `db` if it is there; returns the rows copied."""
    old_path = Path(recordings) / LEGACY_FILE
    if not old_path.is_file() or (db.dialect == "sqlite" and Path(db.url.path).resolve() == old_path.resolve()):
        return 0
    copied = 0
    with db.transaction():
        if not old_path.is_file():  # another worker adopted it while this one waited for the lock
            return 0
        old = open_database(old_path)
        try:
            migrate(old)
            for table, (columns, key) in TABLES.items():
                marks = ", ".join("?" * len(columns.split(",")))
                conflict = f" ON CONFLICT({key}) DO NOTHING" if key else ""
                for row in old.execute(f"SELECT {columns} FROM {table}"):
                    db.execute(f"INSERT INTO {table}({columns}) VALUES({marks}){conflict}", row)
                    copied += 1
        finally:
            old.close()
        for suffix in ("", "-wal", "-shm"):
            part = old_path.with_name(old_path.name + suffix)
            if part.exists():
                part.rename(part.with_name(LEGACY_FILE + ADOPTED_SUFFIX + suffix))
    log.warning("store_adopted", old=str(old_path), into=db.url.display, rows=copied,
                note=f"the old file is kept as {LEGACY_FILE}{ADOPTED_SUFFIX}")
    return copied
