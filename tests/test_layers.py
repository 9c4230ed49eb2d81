"""The house drawing: each package sits on a floor and imports only from floors below it (or from
itself); product code never imports the lab wing; light commands stay light."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "callcenter"

# lowest first; a unit is a subpackage (`callcenter/voice/`) or a top-level module (`callcenter/cli.py`)
FLOORS = [
    {"__init__", "errors"},
    {"logs", "audio", "text", "yamlfile", "memory", "metrics", "store"},
    {"hearing", "voice"},
    {"dialog", "campaign"},
    {"call"},
    {"telephony", "supervisor", "flowtest", "hear_back", "testing", "aftercall",
     "reports"},  # transports own their call control
    {"server", "workers"},
    {"studio"},  # the training wing: serving never imports it
    {"lab"},
    {"cli"},
    {"reference"},  # the docs' reference pages, made from everything below
]
FLOOR = {unit: i for i, units in enumerate(FLOORS) for unit in units}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "callcenter"


def imports(path: Path):
    """(module imported, line, imported inside a function?) for every callcenter import in `path`."""
    tree = ast.parse(path.read_text())
    nested = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nested.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "callcenter":
            names = [f"callcenter.{a.name}" for a in node.names] if node.module == "callcenter" else [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "callcenter"]
        for name in names:
            yield name, node.lineno, id(node) in nested


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        yield path, ".".join(rel.parts)


def test_every_unit_has_a_floor():
    units = {unit_of(m) for _, m in modules()} - {"callcenter"}
    assert units <= set(FLOOR), f"put these on a floor in FLOORS: {sorted(units - set(FLOOR))}"


def test_no_import_runs_up_a_floor_or_sideways():
    wrong = []
    for path, module in modules():
        here = unit_of(module)
        if here == "callcenter":
            continue
        for name, line, _ in imports(path):
            there = unit_of(name)
            if there == here:
                continue
            if FLOOR[there] >= FLOOR[here]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {here} (floor {FLOOR[here]}) imports {name} "
                             f"(floor {FLOOR[there]})")
    assert not wrong, "\n".join(wrong)


def test_product_code_never_imports_the_lab():
    """Only the command line reaches into the lab, and only inside its bench and demo commands."""
    wrong = []
    for path, module in modules():
        if unit_of(module) == "lab":
            continue
        for name, line, in_function in imports(path):
            if unit_of(name) == "lab" and not (unit_of(module) == "cli" and in_function):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert not wrong, "\n".join(wrong)


def test_serving_never_imports_the_training_wing():
    """Nothing the call server runs imports `callcenter.studio` (training, cloning, teachers): only
    the command line's voice commands and the lab's benches do. Checked in the source, and in what
    starting the server's modules loads (no torch)."""
    serving = {"audio", "text", "yamlfile", "logs", "memory", "metrics", "store", "hearing", "voice", "telephony",
               "dialog", "call", "supervisor", "flowtest", "server", "workers", "testing"}
    wrong = [f"{path.relative_to(ROOT)}:{line}: imports {name}" for path, module in modules()
             if unit_of(module) in serving for name, line, _ in imports(path) if unit_of(name) == "studio"]
    assert not wrong, "\n".join(wrong)
    loaded = _loaded_by("import callcenter.server, callcenter.workers")
    assert not {m for m in loaded if m.startswith("callcenter.studio")} and "torch" not in loaded


def test_the_console_side_and_the_config_keep_their_distance():
    """The supervisor reaches calls only through the control API's own types, never through
    `telephony`; the server config (`telephony/config.py`) never imports the voices."""
    wrong = []
    for path, module in modules():
        for name, line, _ in imports(path):
            if unit_of(module) == "supervisor" and unit_of(name) == "telephony" or \
                    module == "callcenter.telephony.config" and unit_of(name) == "voice":
                wrong.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert not wrong, "\n".join(wrong)


def _loaded_by(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


HEAVY = {"torch", "scipy", "pjsua2", "soxr", "noisereduce", "ctranslate2", "faster_whisper", "aiortc", "onnxruntime"}


def test_flows_check_and_the_console_stay_light():
    check = _loaded_by("from callcenter.cli import main\nmain(['flows', 'check', 'flows/support.yaml'])")
    assert not HEAVY & check, f"flows check loads {sorted(HEAVY & check)}"
    console = _loaded_by("import callcenter.supervisor.tui")
    assert not (HEAVY | {"numpy"}) & console, f"the console loads {sorted((HEAVY | {'numpy'}) & console)}"


NOT_FRAME_STAGES = {"callcenter.audio.resample:Resampler",  # 48 kHz arrays inside a transport, before frames
                    "callcenter.audio.stage:FrameStage"}  # the contract itself


def test_every_per_frame_stage_keeps_the_one_contract():
    """`process(self, frame: AudioFrame, at: Moment)` on every stage in `audio.stage.STAGES`, and no
    other `process` method in the product (read from the source: nothing is imported)."""
    from callcenter.audio.stage import STAGES

    found = {}
    for path, module in modules():
        if unit_of(module) == "lab":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "process":
                        found[f"{module}:{node.name}"] = item
    assert set(found) - NOT_FRAME_STAGES == set(STAGES), "list every per-frame stage in audio/stage.py STAGES"
    for name in [*STAGES, "callcenter.audio.stage:FrameStage"]:
        args = found[name].args
        signature = [(a.arg, ast.unparse(a.annotation) if a.annotation else None) for a in args.args]
        assert signature == [("self", None), ("frame", "AudioFrame"), ("at", "Moment")], f"{name}: {signature}"
        assert not args.defaults and not args.kwonlyargs and not args.vararg and not args.kwarg, name


def test_the_code_is_lint_clean():
    """ruff with the project's configuration ([tool.ruff] in pyproject.toml)."""
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "callcenter", "tests", "benchmarks"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]
