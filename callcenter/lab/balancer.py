"""Kamailio as the tests and benches run it (`Fleet`, and the tests that start their own): Debian's
binary in the foreground (`-DD -E`), in a process group of its own, its log in a file. Stopping asks
politely first (SIGTERM, as systemd does) and then kills the whole group, so a child stuck on a slow
machine (a database timer mid-query) can never leave a port bound or outlive its run."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

STOP_GRACE_S = 20.0


class KamailioProcess:
    def __init__(self, cfg: Path, log: Path, pid: Path):
        self.log = log
        self.proc = subprocess.Popen(["kamailio", "-DD", "-E", "-f", str(cfg), "-P", str(pid)],
                                     stdout=subprocess.DEVNULL, stderr=open(log, "ab"), start_new_session=True)

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> None:
        """SIGTERM to the group, then SIGKILL to the group after STOP_GRACE_S."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with open(self.log, "a") as f:
                    f.write(f"tests: kamailio ignored SIGTERM for {STOP_GRACE_S:.0f} s; killed\n")
        self._signal(signal.SIGKILL)  # the main process may be gone with children left
        self.proc.wait(10)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
