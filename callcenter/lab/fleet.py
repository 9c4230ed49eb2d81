"""`serve --workers N` behind a real Kamailio, as child processes on loopback: what the scaling
tests and `bench call --workers N` run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from callcenter.lab.balancer import KamailioProcess
from callcenter.telephony.config import load_server_config
from callcenter.workers import worker_uris


def control_request(url: str, token: str, path: str, body: dict | None = None) -> dict:
    """One control-API request (GET, or POST with `body`) with the bearer token; the JSON reply."""
    import json
    import urllib.request

    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                                 method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


class Fleet:
    """`serve --workers N` with Kamailio in front, as child processes on loopback: what the scaling
    test and `bench call --workers N` run. Callers dial `uri` (the balancer).

    One host of several (`lab.hosts.HostNetwork`): `host` is its address, `prefix` what runs a
    command there, and `balancer` the address of a Kamailio the hosts share (then `start` starts
    none of its own)."""

    def __init__(self, workdir: Path, flow: str | Path, workers: int, sip_port: int, balancer_port: int,
                 rtp_port: int = 31000, extra_config: str = "", agents: dict[str, str] | None = None,
                 host: str = "127.0.0.1", prefix: list[str] | None = None, balancer: str | None = None,
                 env: dict[str, str] | None = None):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.flow = str(flow)
        self.workers = workers
        self.sip_port = sip_port
        self.balancer_port = balancer_port
        self.recordings = self.dir / "recordings"
        self.config = self.dir / "sip.yaml"
        self.host, self.prefix, self.env = host, prefix or [], env
        self.shared_balancer = balancer is not None
        balancer = balancer or host
        self.config.write_text(f"listen: {{host: {host}, port: {sip_port}}}\nrtp_port: {rtp_port}\n"
                               f"max_calls: 4\nrecordings: {self.recordings}\n"
                               f"trusted_proxies: ['{balancer}:{balancer_port}']\n" + extra_config)
        self.log_path = self.dir / "workers.log"
        self.kamailio_log = self.dir / "kamailio.log"
        self.agents = agents or {}  # human agents (user -> password) who register with the Kamailio
        self.uri = f"sip:agent@{balancer}:{balancer_port}"
        self.pool: subprocess.Popen | None = None
        self.kamailio: KamailioProcess | None = None

    def start(self, timeout: float = 180) -> "Fleet":
        return self.launch().wait_started(timeout)

    def launch(self) -> "Fleet":
        """Start the workers without waiting for them (`wait_started`)."""
        self.pool = subprocess.Popen([*self.prefix, sys.executable, "-m", "callcenter.cli", "serve", "--workers",
                                      str(self.workers), "--config", str(self.config), "--flow", self.flow],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb"), env=self.env)
        return self

    def wait_started(self, timeout: float = 180) -> "Fleet":
        assert self.pool is not None
        deadline = time.monotonic() + timeout
        while len(self.log_lines("sip_listening")) < self.workers:
            if time.monotonic() > deadline or self.pool.poll() is not None:
                raise RuntimeError(f"workers did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        if self.shared_balancer:
            return self
        from callcenter.telephony.kamailio import write_kamailio_config

        cfg = write_kamailio_config(self.dir / "kamailio", f"{self.host}:{self.balancer_port}",
                                    self.worker_uris(), agents=self.agents)
        self.kamailio = KamailioProcess(cfg, self.kamailio_log, self.dir / "kam.pid")
        self.kamailio.wait_ready(self.host, self.balancer_port)
        return self

    @property
    def store(self) -> str:
        """The URL of the store this server writes to (its config's `store:`, or the default)."""
        return load_server_config(self.config).store_url().text

    def log_lines(self, event: str) -> list[dict]:
        import json

        out = []
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        for line in text.splitlines():
            if f'"{event}"' in line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def warmed(self) -> bool:
        """Has every worker synthesised its flow's fixed prompts (`prompts_warmed`)?"""
        return len(self.log_lines("prompts_warmed")) >= self.workers

    def worker_pids(self) -> list[int]:
        latest: dict[int, int] = {}
        for w in self.log_lines("worker_started"):
            latest[w["worker"]] = w["pid"]
        return [latest[i] for i in sorted(latest)]

    def worker_uris(self) -> list[str]:
        return worker_uris(load_server_config(self.config), self.workers)

    def kill(self) -> None:
        """kill -9 every worker, then the pool: the host dies as in a power cut (the pool first would
        have the workers told to stop, and they would start to end their calls cleanly)."""
        for pid in [*self.worker_pids(), *([self.pool.pid] if self.pool else [])]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.pool:
            self.pool.wait(10)

    def calls(self) -> list[Path]:
        return sorted(self.recordings.glob("*/*.jsonl"))

    def stop(self) -> None:
        if self.kamailio is not None:  # never leave the pool running because Kamailio was slow
            self.kamailio.stop()
        if self.pool and self.pool.poll() is None:
            self.pool.send_signal(signal.SIGTERM)
            try:
                self.pool.wait(30)
            except subprocess.TimeoutExpired:
                self.pool.kill()
