"""A PostgreSQL server of the tests' own, from Debian's package: `initdb` and `pg_ctl` in a temporary
folder (run as the `postgres` user when the tests run as root), on a loopback port, never a system
service. One server per test session; each test gets a database of its own."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

PG_ROOT = Path("/usr/lib/postgresql")
_names = itertools.count(1)


def pg_bin() -> Path | None:
    found = sorted(PG_ROOT.glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


class Postgres:
    def __init__(self, port: int, address: str = "127.0.0.1", clients: str | None = None):
        """`address`: where it listens besides loopback (a test network's); `clients`: the network
        (CIDR) whose hosts may connect to it there, without a password as on loopback."""
        self.bin = pg_bin()
        self.port = port
        self.address, self.clients = address, clients
        self.dir = Path(tempfile.mkdtemp(prefix="callcenter-pg-"))
        self.data, self.log = self.dir / "data", self.dir / "server.log"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres", "postgres")
        os.chmod(self.dir, 0o755)

    def _run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*self._as, *cmd], capture_output=True, text=True, check=check, timeout=60)

    def start(self) -> "Postgres":
        if not self.data.exists():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--no-locale")
            if self.clients:
                hba = self.data / "pg_hba.conf"
                self._run("sh", "-c", f"echo 'host all all {self.clients} trust' >> {hba}")
        listen = ",".join(dict.fromkeys(["127.0.0.1", self.address]))
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses={listen} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.log), "-w",
                  "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, down_s: float = 0.0) -> None:
        self.stop("fast")
        time.sleep(down_s)
        self.start()

    def sql(self, statement: str, db: str = "postgres") -> str:
        out = self._run(str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                        "-d", db, "-Atc", statement)
        return out.stdout.strip()

    def new_database(self) -> str:
        """A fresh database for one test; its URL."""
        name = f"cc_{os.getpid()}_{next(_names)}"
        self.sql(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@{self.address}:{self.port}/{name}"

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
