"""The docs' snippets are checked as a reader would use them: docs/first-flow.md put together step by
step into one flow, which must load, and its scenario file, which must pass."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"```yaml\n(.*?)```", re.S)


def merge(into: dict, part: dict) -> dict:
    for key, value in part.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def test_the_first_flow_tutorial_runs_as_written(tmp_path):
    from callcenter.dialog.flow import load_flow
    from callcenter.flowtest import run_scenarios
    from callcenter.yamlfile import YamlLoader

    blocks = [yaml.load(b, Loader=YamlLoader) for b in FENCE.findall((ROOT / "docs" / "first-flow.md").read_text())]
    assert all(isinstance(b, dict) for b in blocks), "every snippet is valid YAML (no '...')"
    flow: dict = {}
    scenarios = []
    for block in blocks:
        if "flow" in block and "scenarios" in block:
            scenarios.append(block)
        else:
            merge(flow, block)
    (tmp_path / "pharmacy.yaml").write_text(yaml.safe_dump(flow, sort_keys=False))
    load_flow(tmp_path / "pharmacy.yaml")  # every node it names is there, and it checks clean
    assert len(scenarios) == 1
    (tmp_path / "pharmacy-test.yaml").write_text(yaml.safe_dump(scenarios[0], sort_keys=False))
    passed, failed, reports = run_scenarios([str(tmp_path / "pharmacy-test.yaml")], out_root=tmp_path / "out")
    assert failed == 0 and passed == len(scenarios[0]["scenarios"]), reports
