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

from callcenter.hearing.decoding import default_threads
from callcenter.memory import libc_function
from callcenter.telephony.config import ServerConfig, load_server_config

log = structlog.get_logger()

RTP_PORTS_PER_WORKER = 1000
RESTART_AFTER_S = 1.0
FAILED_START_S = 30.0  # a worker that exits this soon after its start did not start...
FAILED_STARTS_MAX = 3  # ...and after this many such starts in a row with one exit code, it is not restarted
WATCH_S = 0.2
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
_PRCTL = libc_function("prctl")  # looked up here, not in the forked child


def _end_with_supervisor() -> None:
    """In a worker, before exec: SIGTERM when the supervisor dies (even by kill -9), so that no
    orphaned worker keeps its SIP port and models after the pool is gone."""
    if _PRCTL is not None:  # None off Linux: workers then outlive a killed supervisor
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def worker_configs(config: ServerConfig, workers: int, run_dir: Path) -> list[tuple[Path, ServerConfig]]:
    """Worker i listens on listen.port + i, RTP from rtp_port + 1000·i, control port + i, browser
    calls on webrtc port + i (each worker its own /call page; a web front end spreads browsers)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(workers):
        data = config.model_dump(mode="json")
        data["listen"]["port"] = config.listen.port + i
        data["rtp_port"] = config.rtp_port + RTP_PORTS_PER_WORKER * i
        data["recordings"] = str(Path(config.recordings).resolve())
        data["store"] = config.store_url().text  # one store for all, wherever each worker's config lies
        if data.get("contact_center"):
            data["contact_center"]["store"] = None
        data["decode_threads"] = config.decode_threads or default_threads(workers)  # the cores, shared
        if config.control is not None:
            data["control"]["port"] = config.control.port + i if config.control.port else 0
        if config.webrtc is not None:
            data["webrtc"]["port"] = config.webrtc.port + i if config.webrtc.port else 0
        path = run_dir / f"worker-{i}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        out.append((path, ServerConfig.model_validate(data)))
    return out


def worker_control_urls(config: ServerConfig, workers: int) -> list[str]:
    """The control APIs of `serve --workers N` (control.port + i), for `callcenter tui --config`."""
    if config.control is None:
        raise ValueError("the config has no control: section, so the workers have no control API")
    return [f"http://{config.control.host}:{config.control.port + i}" for i in range(workers)]


def fleet_control_urls(config: ServerConfig) -> list[str]:
    """The control APIs of every live worker the config's store knows (any host); [] if none."""
    from callcenter.store.db import StoreError, open_database
    from callcenter.store.workers import live_workers

    try:
        db = open_database(config.store_url())
    except StoreError:
        return []
    try:
        return [w.control for w in live_workers(db) if w.control]
    except StoreError:  # a store not yet migrated (no worker has started on it)
        return []
    finally:
        db.close()


def worker_uris(config: ServerConfig, workers: int) -> list[str]:
    return [f"sip:{config.listen.host}:{config.listen.port + i}" for i in range(workers)]


class WorkerPool:
    def __init__(self, config_path: str, flow: str, workers: int, stt_model: str | None = None):
        self.config = load_server_config(config_path)
        self.flow = flow
        self.stt_model = stt_model
        self.configs = worker_configs(self.config, workers, Path(self.config.recordings) / ".workers")
        self.procs: list[subprocess.Popen | None] = [None] * workers
        self.restarts = [0] * workers
        self.started_at = [0.0] * workers
        self.failed_starts: list[list[int]] = [[] for _ in range(workers)]  # exit codes of quick deaths in a row
        self._stopping = False

    def _start(self, i: int) -> None:
        path, cfg = self.configs[i]
        cmd = [sys.executable, "-m", "callcenter.cli", "serve", "--config", str(path), "--flow", self.flow]
        if self.stt_model:
            cmd += ["--stt-model", self.stt_model]
        self.procs[i] = subprocess.Popen(cmd, preexec_fn=_end_with_supervisor)
        self.started_at[i] = time.monotonic()
        log.info("worker_started", worker=i, pid=self.procs[i].pid,
                 sip=f"{cfg.listen.host}:{cfg.listen.port}", restarts=self.restarts[i])

    def _restart(self, i: int, proc: subprocess.Popen) -> bool:
        """Restart a worker that died, unless it keeps failing the same way at start (a corrupt store,
        a bad config): restarting it every second would only reload its models again and again."""
        quick = time.monotonic() - self.started_at[i] < FAILED_START_S
        self.failed_starts[i] = self.failed_starts[i] + [proc.returncode] if quick else []
        same = self.failed_starts[i][-FAILED_STARTS_MAX:]
        if len(same) >= FAILED_STARTS_MAX and len(set(same)) == 1:
            log.error("worker_not_restarted", worker=i, returncode=proc.returncode, starts=len(same),
                      note=f"it failed at start {len(same)} times in a row the same way; fix the cause and "
                           "restart serve")
            return False
        log.error("worker_died", worker=i, pid=proc.pid, returncode=proc.returncode,
                  note="its calls are lost; restarting")
        time.sleep(RESTART_AFTER_S)
        self.restarts[i] += 1
        self._start(i)
        return True

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
                    if not self._restart(i, proc):
                        self.procs[i] = None
            if all(p is None for p in self.procs):
                log.error("workers_failed", note="every worker fails at start; see its error above")
                return 2
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
