"""One database, two back ends: embedded SQLite (one machine, no server) and PostgreSQL (many
machines, through psycopg 3). Everything above this module writes one SQL dialect, the common part
of both: `?` placeholders, `INSERT … ON CONFLICT … DO UPDATE`, `CASE WHEN` instead of a boolean sum,
and `{real}` for a floating-point column (REAL in SQLite, DOUBLE PRECISION in PostgreSQL, whose REAL
is single precision and would round a Unix time to minutes).

A store transaction is exclusive across every process and host that shares the database: SQLite's
`BEGIN IMMEDIATE`, PostgreSQL's transaction-scoped advisory lock. The store's transactions are a few
short statements each, so one writer at a time costs nothing and makes every read-then-write (the
first caller in line, the longest-idle agent) safe without row locks.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from callcenter.errors import CallcenterError
from callcenter.store.url import StoreUrl

STORE_LOCK = 731_204_001  # the advisory lock every store transaction holds (PostgreSQL)
CONNECT_TIMEOUT_S = 5
BUSY_TIMEOUT_S = 5.0


class StoreError(CallcenterError):
    """The store refused: unreachable, corrupt, or a statement failed. Said in one line, with the
    store's URL (never a password)."""


class StoreUnavailable(StoreError):
    """The database cannot be reached (PostgreSQL down or restarting)."""


class Database:
    """A connection to the store; safe from several threads of one process (one lock)."""

    dialect = ""

    def __init__(self, url: StoreUrl):
        self.url = url
        self._lock = threading.RLock()

    # ---- what callers use
    @contextmanager
    def transaction(self) -> Iterator["Database"]:
        """An exclusive transaction: every statement inside commits together or not at all."""
        with self._lock:
            self._begin()
            try:
                yield self
            except BaseException:
                self._rollback()
                raise
            self._commit()

    def reading(self) -> threading.RLock:
        """Hold this connection for several reads in a row (no transaction, no lock on the store)."""
        return self._lock

    def execute(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        """Run one statement (`?` placeholders, `{real}` columns); the rows it returns, if any."""
        with self._lock:
            try:
                return self._execute(self.adapt(sql), tuple(args))
            except StoreError:
                raise
            except Exception as exc:
                raise self._error(exc) from None

    def adapt(self, sql: str) -> str:
        return sql.replace("{real}", self.real_type)

    def close(self) -> None:
        with self._lock:
            self._close()

    # ---- back ends
    real_type = "REAL"

    def _begin(self) -> None: ...
    def _commit(self) -> None: ...
    def _rollback(self) -> None: ...
    def _execute(self, sql: str, args: tuple) -> list[tuple]: ...
    def _close(self) -> None: ...

    def _error(self, exc: Exception) -> StoreError:
        return StoreError(f"store {self.url.display}: {exc}".strip())


class SqliteDatabase(Database):
    dialect = "sqlite"

    def __init__(self, url: StoreUrl):
        super().__init__(url)
        path = Path(url.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a committed change survives kill -9
            self._db.execute("SELECT count(*) FROM sqlite_master").fetchall()  # a corrupt file fails here
        except sqlite3.Error as exc:
            raise StoreError(f"store {url.display}: {exc}") from None
        os.chmod(path, 0o600)

    def _begin(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def _commit(self) -> None:
        self._db.execute("COMMIT")

    def _rollback(self) -> None:
        self._db.execute("ROLLBACK")

    def _execute(self, sql: str, args: tuple) -> list[tuple]:
        return self._db.execute(sql, args).fetchall()

    def _close(self) -> None:
        self._db.close()


class PostgresDatabase(Database):
    dialect = "postgresql"
    real_type = "DOUBLE PRECISION"

    def __init__(self, url: StoreUrl):
        super().__init__(url)
        try:
            import psycopg
        except ImportError:  # pragma: no cover - scripts/setup installs it
            raise StoreError("a postgresql:// store needs psycopg (pip install 'psycopg[binary]')") from None
        self._psycopg = psycopg
        self._conn = None
        self._connect()

    def _connect(self) -> None:
        try:
            self._conn = self._psycopg.connect(self.url.conninfo(), autocommit=True,
                                               connect_timeout=CONNECT_TIMEOUT_S)
        except self._psycopg.Error as exc:
            raise StoreUnavailable(f"store {self.url.display} is unreachable: {_first_line(exc)}") from None

    def _ensure(self) -> None:
        if self._conn is None or self._conn.closed:
            self._connect()

    def _begin(self) -> None:
        try:
            self._ensure()
            self._conn.execute("BEGIN")
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (STORE_LOCK,))
        except self._psycopg.Error as exc:
            raise self._error(exc) from None

    def _commit(self) -> None:
        try:
            self._conn.execute("COMMIT")
        except self._psycopg.Error as exc:
            raise self._error(exc) from None

    def _rollback(self) -> None:
        try:
            if self._conn is not None and not self._conn.closed:
                self._conn.execute("ROLLBACK")
        except self._psycopg.Error:
            pass

    def _execute(self, sql: str, args: tuple) -> list[tuple]:
        self._ensure()
        cur = self._conn.execute(_placeholders(sql), args or None)
        return cur.fetchall() if cur.description is not None else []

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _error(self, exc: Exception) -> StoreError:
        if isinstance(exc, (self._psycopg.OperationalError, self._psycopg.InterfaceError)):
            if self._conn is not None and self._conn.closed:
                self._conn = None  # reconnect on the next statement
            return StoreUnavailable(f"store {self.url.display} is unreachable: {_first_line(exc)}")
        return StoreError(f"store {self.url.display}: {_first_line(exc)}")


_QMARK = re.compile(r"\?")


def _placeholders(sql: str) -> str:
    """`?` → `%s` (the store's SQL has no `?` or `%` of its own inside strings)."""
    return _QMARK.sub("%s", sql)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def open_database(url: StoreUrl | str | Path, base: Path | None = None) -> Database:
    """Connect to the store at `url` (a StoreUrl, a URL, or a plain SQLite path)."""
    if not isinstance(url, StoreUrl):
        url = StoreUrl.parse(str(url), base)
    if url.scheme == "sqlite":
        return SqliteDatabase(url)
    return PostgresDatabase(url)

