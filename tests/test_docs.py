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


def readme_as_docs_index() -> str:
    """docs/index.md is the README with its links made relative to docs/ (the site's home page)."""
    text = (ROOT / "README.md").read_text()
    text = text.replace("](docs/", "](")
    return text.replace("[CHANGELOG.md](CHANGELOG.md) says what changed.", "`CHANGELOG.md` in the repository says what changed.")


def test_the_readme_is_a_short_users_guide_and_the_sites_home():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert (ROOT / "docs" / "index.md").read_text() == readme_as_docs_index(), \
        "run: python -c 'from tests.test_docs import readme_as_docs_index as r; open(\"docs/index.md\",\"w\").write(r())'"
    for flow in [yaml.load(b, Loader=__import__("callcenter.yamlfile", fromlist=["YamlLoader"]).YamlLoader)
                 for b in FENCE.findall(readme)]:
        if isinstance(flow, dict) and {"name", "start", "nodes"} <= set(flow):
            import tempfile

            from callcenter.dialog.flow import load_flow

            with tempfile.TemporaryDirectory() as d:
                (Path(d) / "flow.yaml").write_text(yaml.safe_dump(flow, sort_keys=False))
                load_flow(Path(d) / "flow.yaml")


def test_the_docs_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: every page in the nav, every link to a page that exists."""
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "site" / "store" / "index.html").exists()


def test_the_reference_pages_are_generated_from_the_code():
    """docs/reference/*.md equal what `python -m callcenter.reference` makes now: a field, flag or
    event kind added without regenerating them fails here."""
    from callcenter.reference import main

    assert main(["--check"]) == 0, "run: python -m callcenter.reference"


def test_benchmarks_md_is_generated_from_the_committed_results():
    """BENCHMARKS.md equals `callcenter bench report`'s rendering of benchmarks/results/*.json, and
    every result names the command, commit and machine that made it."""
    import json

    from callcenter.lab.bench.report import RESULTS_DIR, report

    assert (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8") == report(), \
        "run: callcenter bench report --markdown BENCHMARKS.md"
    for path in RESULTS_DIR.glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert {"made_by", "commit", "machine"} <= data.keys(), path
