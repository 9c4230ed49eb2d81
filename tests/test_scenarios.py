"""`callcenter test`: the shipped scenarios of every example flow pass, and a failing or broken
scenario says what went wrong."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cc(*args, cwd=ROOT, timeout=600):
    return subprocess.run([sys.executable, "-m", "callcenter.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


@pytest.mark.slow
def test_every_example_flow_has_passing_scenarios(tmp_path):
    files = sorted((ROOT / "flows" / "tests").glob("*.yaml"))
    flows = {p.stem for p in (ROOT / "flows").glob("*.yaml")} - {"support"}  # support: test_dialog, SIP tests
    assert flows <= {f.stem for f in files}
    r = cc("test", *files, "--json", tmp_path / "report.json", "--out", tmp_path / "calls")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["failed"] == 0 and report["passed"] >= 20
    audio = [s for s in report["scenarios"] if "audio pipeline" in s["name"]]
    assert len(audio) == 2 and any(s["turn_ms"] for s in audio)  # the voicemail call has no answered turn
    voicemails = list((tmp_path / "calls").rglob("*-voicemail.wav"))
    assert voicemails and voicemails[0].stat().st_size > 16000  # more than a second of message


def test_failing_and_broken_scenarios_are_reported(tmp_path):
    (tmp_path / "s.yaml").write_text(f"""\
flow: {ROOT / 'flows' / 'after_hours.yaml'}
scenarios:
  - name: wrong expectation
    at: 2026-12-05 11:00
    steps:
      - keys: "2"
    expect:
      said: [we are open on sundays]
      ended_by: transfer
""")
    (tmp_path / "broken.yaml").write_text("flow: x.yaml\nscenarios:\n  - name: a\n    steps:\n      - sing: la\n")
    r = cc("test", tmp_path / "s.yaml", tmp_path / "broken.yaml")
    assert r.returncode == 1
    assert "FAIL" in r.stdout and "expected the agent to say 'we are open on sundays'" in r.stdout
    assert "expected the call to be ended by transfer; it was ended by agent" in r.stdout
    assert f"{tmp_path / 'broken.yaml'}:5:" in r.stdout and "sing" in r.stdout
    assert "1 passed" not in r.stdout and "0 passed, 2 failed" in r.stdout
