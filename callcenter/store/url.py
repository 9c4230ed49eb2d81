"""Where the store is: `store:` in the server config.

- `sqlite:///callcenter.db` or `sqlite:callcenter.db` (a path relative to the config file's folder),
  `sqlite:////var/lib/callcenter/callcenter.db` (four slashes: an absolute path, as SQLAlchemy
  writes it); a plain path is read as an SQLite file too;
- `postgresql://user@host:5432/dbname` (`postgres://` too). The password is never in the file: it
  comes from `PGPASSWORD`, or from the environment variable the URL names with
  `?password_env=NAME`. A URL with a password in it is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from callcenter.errors import CallcenterError

SCHEMES = ("sqlite", "postgresql", "postgres")
DEFAULT_STORE_FILE = "callcenter.db"  # beside the server config, outside recordings/


class StoreUrlError(CallcenterError, ValueError):
    pass


@dataclass(frozen=True)
class StoreUrl:
    scheme: str  # sqlite | postgresql
    path: str = ""  # sqlite: the database file (absolute)
    user: str = ""
    host: str = ""
    port: int | None = None
    dbname: str = ""
    password_env: str = ""  # postgresql: the variable holding the password ("": PGPASSWORD, if set)

    @classmethod
    def parse(cls, text: str, base: Path | None = None) -> "StoreUrl":
        """`text` as a store URL; a relative SQLite path is relative to `base` (the config's folder)."""
        text = str(text).strip()
        scheme, sep, rest = text.partition(":")
        if not sep or scheme not in SCHEMES:
            if "://" not in text and text and not text.startswith(("postgres", "mysql")):  # a plain path
                return cls._sqlite(text, base)
            raise StoreUrlError(f"store {text!r}: use sqlite:///path/to/file.db or postgresql://user@host/dbname")
        if scheme == "sqlite":
            # as SQLAlchemy writes it: sqlite:///relative.db, sqlite:////absolute/path.db; also
            # sqlite:relative.db and sqlite:/absolute/path.db
            if rest.startswith("//"):
                rest = rest[2:]
                rest = rest[1:] if rest.startswith("/") else rest
            return cls._sqlite(unquote(rest), base)
        parts = urlsplit(text)
        if parts.password is not None:
            raise StoreUrlError(f"store {cls._safe(text)}: a password in the URL is refused; put it in PGPASSWORD "
                                "or name a variable with ?password_env=NAME")
        query = parse_qs(parts.query)
        unknown = set(query) - {"password_env"}
        if unknown:
            raise StoreUrlError(f"store {cls._safe(text)}: unknown option {sorted(unknown)[0]!r} (only password_env)")
        dbname = unquote(parts.path.lstrip("/"))
        if not parts.hostname or not dbname:
            raise StoreUrlError(f"store {cls._safe(text)}: name the host and the database "
                                "(postgresql://user@host:5432/dbname)")
        try:
            port = parts.port
        except ValueError:
            raise StoreUrlError(f"store {cls._safe(text)}: the port must be a number") from None
        return cls("postgresql", user=unquote(parts.username or ""), host=parts.hostname, port=port,
                   dbname=dbname, password_env=(query.get("password_env") or [""])[0])

    @classmethod
    def _sqlite(cls, path: str, base: Path | None) -> "StoreUrl":
        if not path:
            raise StoreUrlError("store sqlite: name the database file (sqlite:///path/to/file.db)")
        p = Path(path).expanduser()
        if not p.is_absolute():
            p = (base or Path.cwd()) / p
        return cls("sqlite", path=str(p.resolve()))

    @staticmethod
    def _safe(text: str) -> str:
        parts = urlsplit(text)
        if parts.password is None:
            return text
        return text.replace(f":{parts.password}@", ":***@", 1)

    @property
    def display(self) -> str:
        """The URL as logs and errors show it (never a password)."""
        if self.scheme == "sqlite":
            return f"sqlite:///{self.path}"
        port = f":{self.port}" if self.port else ""
        user = f"{self.user}@" if self.user else ""
        return f"postgresql://{user}{self.host}{port}/{self.dbname}"

    @property
    def text(self) -> str:
        """The URL as a config file would hold it, the SQLite path absolute (what `serve --workers`
        writes into each worker's config)."""
        extra = f"?password_env={self.password_env}" if self.password_env else ""
        return self.display + extra

    def password(self) -> str | None:
        if self.password_env:
            value = os.environ.get(self.password_env)
            if value is None:
                raise StoreUrlError(f"store {self.display}: environment variable {self.password_env} "
                                    "(the database password) is not set")
            return value
        return os.environ.get("PGPASSWORD")

    def conninfo(self) -> str:
        """A libpq connection string (the password from the environment)."""
        parts = {"host": self.host, "port": str(self.port or ""), "dbname": self.dbname, "user": self.user,
                 "password": self.password() or "", "application_name": "callcenter"}
        return " ".join(f"{k}='{_quote(v)}'" for k, v in parts.items() if v)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
