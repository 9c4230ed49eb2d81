"""Kamailio as the tests and benches run it (`Fleet`, and the tests that start their own): Debian's
binary in the foreground (`-DD -E`), in a process group of its own, its log in a file. Stopping asks
politely first (SIGTERM, as systemd does) and then kills the whole group, so a child stuck on a slow
machine (a database timer mid-query) can never leave a port bound or outlive its run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

STOP_GRACE_S = 20.0
READY_S = 15.0  # a Kamailio that does not answer an OPTIONS this long after its start has failed


class KamailioProcess:
    def __init__(self, cfg: Path, log: Path, pid: Path):
        self.log = log
        self.proc = subprocess.Popen(["kamailio", "-DD", "-E", "-f", str(cfg), "-P", str(pid)],
                                     stdout=subprocess.DEVNULL, stderr=open(log, "ab"), start_new_session=True)

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait_ready(self, host: str, port: int, timeout: float = READY_S) -> None:
        """Poll until Kamailio answers an OPTIONS on host:port (it listens, its routes are loaded);
        RuntimeError with its log if it exits or stays silent."""
        deadline = time.monotonic() + timeout
        while not answers_options(host, port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kamailio is not answering on {host}:{port}:\n{self.log.read_text()[-3000:]}")

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


def answers_options(host: str, port: int, wait_s: float = 0.1) -> bool:
    """Does a SIP server answer an OPTIONS on host:port (UDP) within wait_s?"""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host if host.startswith("127.") else "0.0.0.0", 0))
        s.settimeout(wait_s)
        me = s.getsockname()
        msg = (f"OPTIONS sip:{host}:{port} SIP/2.0\r\nVia: SIP/2.0/UDP {me[0]}:{me[1]};rport;branch=z9hG4bK"
               f"{uuid.uuid4().hex[:10]}\r\nMax-Forwards: 70\r\nFrom: <sip:probe@{me[0]}>;tag=1\r\n"
               f"To: <sip:{host}:{port}>\r\nCall-ID: {uuid.uuid4().hex}\r\nCSeq: 1 OPTIONS\r\n"
               "Content-Length: 0\r\n\r\n")
        try:
            s.sendto(msg.encode(), (host, port))
            return s.recvfrom(4096)[0].startswith(b"SIP/2.0")
        except OSError:  # a timeout, or the port refusing (ICMP)
            return False
