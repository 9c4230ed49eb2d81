"""Voice-to-voice before and after the call became a conductor (issue 59): `bench call` on the
commit before the refactor (a git worktree) and on this one, in alternating runs on the same
machine, so drift hits both alike.

    .venv/bin/python benchmarks/conductor_refactor.py benchmarks/results/conductor-refactor.json \\
        [--before COMMIT] [--pairs 3] [--calls 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "92638de"  # the last commit with the 1,008-line CallSession


def run_bench(tree: Path, calls: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "callcenter.cli", "bench", "call", "--calls", str(calls), "--json", str(out)],
                   cwd=tree, check=True, capture_output=True, timeout=900)
    data = json.loads(out.read_text())
    summary = data["summary"]
    return {"voice_to_voice": summary["voice_to_voice"], "turns": summary["turns"]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--before", default=BEFORE)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--calls", type=int, default=3)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="conductor-"))
    old = work / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(old), args.before], cwd=ROOT, check=True,
                   capture_output=True)
    runs = {"before": [], "after": []}
    try:
        for i in range(args.pairs):
            for label, tree in (("before", old), ("after", ROOT)):
                runs[label].append(run_bench(tree, args.calls, work / f"{label}{i}.json"))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    med = {k: {q: statistics.median(r["voice_to_voice"][q] for r in v) for q in ("p50_ms", "p95_ms")}
           for k, v in runs.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    result = {
        "benchmark": "conductor refactor: voice-to-voice before and after",
        "made_by": f".venv/bin/python benchmarks/conductor_refactor.py {args.out} --before {args.before} "
                   f"--pairs {args.pairs} --calls {args.calls}",
        "commit": commit.strip(), "before_commit": args.before,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
        "runs": runs, "median": med,
        "ratio_p50_after_over_before": round(med["after"]["p50_ms"] / med["before"]["p50_ms"], 3),
        "note": "bench call (one scripted SIP call at a time over loopback, flows/support.yaml), before and "
                "after in turn; each run's voice_to_voice is the first RTP frame out minus the caller's last "
                "voiced frame, p50/p95 over its turns; the medians are over the runs.",
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["median"]), result["ratio_p50_after_over_before"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
