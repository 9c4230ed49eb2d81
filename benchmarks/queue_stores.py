"""`callcenter bench queue` on the embedded SQLite store and on PostgreSQL, in one run: a private
PostgreSQL server (Debian's, in a temporary folder, as tests/pg.py starts it) for the second.

    .venv/bin/python benchmarks/queue_stores.py benchmarks/results/queue-stores.json [--workers 2 ...]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from callcenter.lab.bench.queue import bench_queue  # noqa: E402
from tests.pg import Postgres  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--callers", type=int, default=6)
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--hold-s", type=float, default=10.0)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pg = Postgres(port).start()
    try:
        report = bench_queue(Path(args.out), workers=args.workers, callers=args.callers, agents=args.agents,
                             hold_s=args.hold_s, stores=[pg.new_database()])
    finally:
        pg.close()
    import platform
    import subprocess

    report["made_by"] = "benchmarks/queue_stores.py " + " ".join(sys.argv[1:])
    report["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                      text=True).stdout.strip()
    report["machine"] = f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores"
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: {m: v.get(m) for m in ("agent_free_to_ring", "voice_to_voice", "store_transactions_per_call",
                                                   "all_served")} for k, v in report["stores"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
