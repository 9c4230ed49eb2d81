"""Voice activity detection with silero-vad's ONNX model (shipped inside the `silero-vad` wheel).

Runs at 8 kHz on 256-sample windows (32 ms) with 32 samples of context, exactly as silero's own
wrapper does, but on numpy so that no torch import sits on the hot path.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np

from callcenter.audio.frames import SAMPLE_RATE
from callcenter.errors import CallcenterError

VAD_WINDOW_SAMPLES = 256  # silero's window at 8 kHz
VAD_CONTEXT_SAMPLES = 32
VAD_WINDOW_MS = 1000 * VAD_WINDOW_SAMPLES / SAMPLE_RATE

_session = None
_session_lock = threading.Lock()


def _shared_session():
    """One ONNX session per process; each call keeps its own recurrent state."""
    global _session
    with _session_lock:
        if _session is None:
            import onnxruntime

            opts = onnxruntime.SessionOptions()
            opts.inter_op_num_threads = 1
            opts.intra_op_num_threads = 1
            path = model_path()
            _session = onnxruntime.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        return _session


def model_path() -> Path:
    """silero's ONNX file, found without importing its package (whose `__init__` imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise VadMissing("silero VAD is not installed: pip install --no-deps 'silero-vad>=6,<7' (./scripts/setup does)")
    return Path(spec.submodule_search_locations[0]) / "data" / "silero_vad.onnx"


class VadMissing(CallcenterError, RuntimeError):
    pass


class SileroVad:
    """Streaming speech probability: feed float samples of any length, get one probability per
    32 ms window that filled."""

    def __init__(self) -> None:
        self._session = _shared_session()
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, VAD_CONTEXT_SAMPLES), dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)

    def feed(self, samples: np.ndarray) -> list[float]:
        self._pending = np.concatenate([self._pending, samples.astype(np.float32)])
        probs = []
        while len(self._pending) >= VAD_WINDOW_SAMPLES:
            window = self._pending[:VAD_WINDOW_SAMPLES].reshape(1, -1)
            self._pending = self._pending[VAD_WINDOW_SAMPLES:]
            x = np.concatenate([self._context, window], axis=1)
            out, self._state = self._session.run(None, {"input": x, "state": self._state, "sr": self._sr})
            self._context = window[:, -VAD_CONTEXT_SAMPLES:]
            probs.append(float(out[0, 0]))
        return probs
