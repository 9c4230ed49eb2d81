"""`callcenter serve --workers N`: N agent processes, each with its own pjsua2 endpoint (SIP port,
RTP range, control port) and its own models, supervised: a worker that dies is reported and
restarted; its calls are lost, everything else goes on. Kamailio (`callcenter kamailio-config`)
spreads calls over them. All workers write to the same recordings folder (the call log included)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog
import yaml

from callcenter.memory import libc_function
from callcenter.telephony.config import SipConfig, load_sip_config

log = structlog.get_logger()

RTP_PORTS_PER_WORKER = 1000
RESTART_AFTER_S = 1.0
WATCH_S = 0.2
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
_PRCTL = libc_function("prctl")  # looked up here, not in the forked child


def _end_with_supervisor() -> None:
    """In a worker, before exec: SIGTERM when the supervisor dies (even by kill -9), so that no
    orphaned worker keeps its SIP port and models after the pool is gone."""
    if _PRCTL is not None:  # None off Linux: workers then outlive a killed supervisor
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def worker_configs(config: SipConfig, workers: int, run_dir: Path) -> list[tuple[Path, SipConfig]]:
    """Worker i listens on listen.port + i, RTP from rtp_port + 1000·i, control port + i, browser
    calls on webrtc port + i (each worker its own /call page; a web front end spreads browsers)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(workers):
        data = config.model_dump(mode="json")
        data["listen"]["port"] = config.listen.port + i
        data["rtp_port"] = config.rtp_port + RTP_PORTS_PER_WORKER * i
        data["recordings"] = str(Path(config.recordings).resolve())
        if config.control is not None:
            data["control"]["port"] = config.control.port + i if config.control.port else 0
        if config.webrtc is not None:
            data["webrtc"]["port"] = config.webrtc.port + i if config.webrtc.port else 0
        path = run_dir / f"worker-{i}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        out.append((path, SipConfig.model_validate(data)))
    return out


def worker_control_urls(config: SipConfig, workers: int) -> list[str]:
    """The control APIs of `serve --workers N` (control.port + i), for `callcenter tui --config`."""
    if config.control is None:
        raise ValueError("the config has no control: section, so the workers have no control API")
    return [f"http://{config.control.host}:{config.control.port + i}" for i in range(workers)]


def worker_uris(config: SipConfig, workers: int) -> list[str]:
    return [f"sip:{config.listen.host}:{config.listen.port + i}" for i in range(workers)]


class WorkerPool:
    def __init__(self, config_path: str, flow: str, workers: int, stt_model: str | None = None):
        self.config = load_sip_config(config_path)
        self.flow = flow
        self.stt_model = stt_model
        self.configs = worker_configs(self.config, workers, Path(self.config.recordings) / ".workers")
        self.procs: list[subprocess.Popen | None] = [None] * workers
        self.restarts = [0] * workers
        self._stopping = False

    def _start(self, i: int) -> None:
        path, cfg = self.configs[i]
        cmd = [sys.executable, "-m", "callcenter.cli", "serve", "--config", str(path), "--flow", self.flow]
        if self.stt_model:
            cmd += ["--stt-model", self.stt_model]
        self.procs[i] = subprocess.Popen(cmd, preexec_fn=_end_with_supervisor)
        log.info("worker_started", worker=i, pid=self.procs[i].pid,
                 sip=f"{cfg.listen.host}:{cfg.listen.port}", restarts=self.restarts[i])

    def run(self) -> int:
        def stop(*_):
            self._stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        for i in range(len(self.procs)):
            self._start(i)
        while not self._stopping:
            time.sleep(WATCH_S)
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None and not self._stopping:
                    log.error("worker_died", worker=i, pid=proc.pid, returncode=proc.returncode,
                              note="its calls are lost; restarting")
                    time.sleep(RESTART_AFTER_S)
                    self.restarts[i] += 1
                    self._start(i)
        for proc in self.procs:
            if proc and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        log.info("workers_stopped")
        return 0


class Fleet:
    """`serve --workers N` with Kamailio in front, as child processes on loopback: what the scaling
    test and `bench call --workers N` run. Callers dial `uri` (the balancer)."""

    def __init__(self, workdir: Path, flow: str | Path, workers: int, sip_port: int, balancer_port: int,
                 rtp_port: int = 31000, extra_config: str = ""):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.flow = str(flow)
        self.workers = workers
        self.sip_port = sip_port
        self.balancer_port = balancer_port
        self.recordings = self.dir / "recordings"
        self.config = self.dir / "sip.yaml"
        self.config.write_text(f"listen: {{host: 127.0.0.1, port: {sip_port}}}\nrtp_port: {rtp_port}\n"
                               f"max_calls: 4\nrecordings: {self.recordings}\n" + extra_config)
        self.log_path = self.dir / "workers.log"
        self.kamailio_log = self.dir / "kamailio.log"
        self.uri = f"sip:agent@127.0.0.1:{balancer_port}"
        self.pool: subprocess.Popen | None = None
        self.kamailio: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> "Fleet":
        self.pool = subprocess.Popen([sys.executable, "-m", "callcenter.cli", "serve", "--workers", str(self.workers),
                                      "--config", str(self.config), "--flow", self.flow],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb"))
        deadline = time.monotonic() + timeout
        while len(self.log_lines("sip_listening")) < self.workers:
            if time.monotonic() > deadline or self.pool.poll() is not None:
                raise RuntimeError(f"workers did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        from callcenter.telephony.kamailio import write_kamailio_config

        cfg = write_kamailio_config(self.dir / "kamailio", f"127.0.0.1:{self.balancer_port}",
                                    worker_uris(load_sip_config(self.config), self.workers))
        self.kamailio = subprocess.Popen(["kamailio", "-DD", "-E", "-f", str(cfg), "-P", str(self.dir / "kam.pid")],
                                         stdout=subprocess.DEVNULL, stderr=open(self.kamailio_log, "wb"))
        time.sleep(2.0)
        if self.kamailio.poll() is not None:
            raise RuntimeError(f"kamailio exited:\n{self.kamailio_log.read_text()[-3000:]}")
        return self

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

    def calls(self) -> list[Path]:
        return sorted(self.recordings.glob("*/*.jsonl"))

    def stop(self) -> None:
        if self.kamailio and self.kamailio.poll() is None:
            self.kamailio.terminate()
            try:
                self.kamailio.wait(10)
            except subprocess.TimeoutExpired:  # never leave the pool running because Kamailio was slow
                self.kamailio.kill()
        if self.pool and self.pool.poll() is None:
            self.pool.send_signal(signal.SIGTERM)
            try:
                self.pool.wait(30)
            except subprocess.TimeoutExpired:
                self.pool.kill()
