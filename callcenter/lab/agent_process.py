"""`callcenter serve` as a child process on loopback, for tests, benchmarks and the demo."""

from __future__ import annotations

from pathlib import Path

from callcenter.errors import CallcenterError
from callcenter.telephony.config import load_server_config


class AgentStartError(CallcenterError, RuntimeError):
    pass


class AgentProcess:
    """`callcenter serve` as a child process on its own SIP port and recordings folder (tests,
    benchmarks, the demo)."""

    def __init__(self, workdir: Path, sip_port: int, rtp_port: int, flow: str | Path = "flows/support.yaml",
                 max_calls: int = 4, recordings: Path | None = None, control_port: int | None = None,
                 token: str | None = None, extra_config: str = "", webrtc_port: int | None = None,
                 webrtc_max_calls: int = 2, env: dict[str, str] | None = None):
        import sys

        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.recordings = Path(recordings).resolve() if recordings else self.dir / "recordings"
        self.config = self.dir / "sip.yaml"
        self.config.write_text(
            f"listen: {{host: 127.0.0.1, port: {sip_port}}}\nrtp_port: {rtp_port}\nmax_calls: {max_calls}\n"
            f"recordings: {self.recordings}\n"
            + (f"control: {{host: 127.0.0.1, port: {control_port}}}\n" if control_port is not None else "")
            + (f"webrtc: {{host: 127.0.0.1, port: {webrtc_port}, max_calls: {webrtc_max_calls}, "
               f"candidates: [127.0.0.1]}}\n" if webrtc_port is not None else "")
            + extra_config
        )
        self.control_url = f"http://127.0.0.1:{control_port}" if control_port is not None else None
        self.webrtc_url = f"http://127.0.0.1:{webrtc_port}" if webrtc_port is not None else None
        self.token = token
        self.sip_port = sip_port
        self.rtp_port = rtp_port
        self.uri = f"sip:agent@127.0.0.1:{sip_port}"
        self.log_path = self.dir / "agent.log"
        self.cmd = [sys.executable, "-m", "callcenter.cli", "serve", "--config", str(self.config), "--flow", str(flow)]
        self.proc = None
        self.env = env or {}  # set in the agent's environment (e.g. CALLCENTER_LLM=off)

    def start(self, timeout: float = 90) -> "AgentProcess":
        import os
        import subprocess
        import time

        env = dict(os.environ, **self.env, **({"CALLCENTER_TOKEN": self.token} if self.token else {}))
        # a restart appends to the same log: only this run's lines say it is ready
        started_at = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=open(self.log_path, "ab"), env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log()[started_at:]
            if '"sip_listening"' in text and (self.control_url is None or '"control_listening"' in text) \
                    and (self.webrtc_url is None or '"webrtc_listening"' in text):
                return self
            if self.proc.poll() is not None:
                raise AgentStartError(f"agent exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        raise AgentStartError(f"agent did not start listening within {timeout} s:\n{self.log()[-3000:]}")

    @property
    def store(self) -> str:
        """The URL of the store this server writes to (its config's `store:`, or the default)."""
        return load_server_config(self.config).store_url().text

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def warmed(self) -> bool:
        """Has the agent synthesised its flow's fixed prompts (`prompts_warmed`)?"""
        return '"prompts_warmed"' in self.log()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except Exception:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """kill -9, as a crash would."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def calls(self) -> list[Path]:
        return sorted(self.recordings.glob("*/*.jsonl"))
