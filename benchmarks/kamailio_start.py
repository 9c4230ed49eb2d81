"""What it costs to start and stop a Kamailio as the tests do (`KamailioProcess`, a config from
`write_kamailio_config` with two workers and a registrar): from the process start to the first
answer to an OPTIONS on its port, and from SIGTERM to its end. Decides whether the tests should
share one Kamailio per session (docs/decisions/0005-kamailio-per-test.md).

    .venv/bin/python benchmarks/kamailio_start.py benchmarks/results/kamailio-start.json [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from callcenter.lab.balancer import KamailioProcess, answers_options
from callcenter.telephony.kamailio import write_kamailio_config

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(work: Path) -> dict:
    port = free_port()
    cfg = write_kamailio_config(work, f"127.0.0.1:{port}", ["sip:127.0.0.1:5901", "sip:127.0.0.1:5902"],
                                agents={"alice": "pw"})
    t0 = time.monotonic()
    kam = KamailioProcess(cfg, work / "kamailio.log", work / "kam.pid")
    while not answers_options("127.0.0.1", port):
        if time.monotonic() - t0 > 30:
            raise RuntimeError((work / "kamailio.log").read_text()[-2000:])
    ready = time.monotonic() - t0
    t1 = time.monotonic()
    kam.stop()
    return {"ready_s": round(ready, 3), "stop_s": round(time.monotonic() - t1, 3)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            runs.append(one_run(Path(d)))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    result = {
        "benchmark": "kamailio start and stop, as the tests run it",
        "made_by": f".venv/bin/python benchmarks/kamailio_start.py {args.out} --runs {args.runs}",
        "commit": commit.strip(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
        "runs": runs,
        "median": {k: statistics.median(r[k] for r in runs) for k in ("ready_s", "stop_s")},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["median"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
