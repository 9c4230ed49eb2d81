"""A worker's memory over a long day: glibc keeps the pages that busy threads freed, and gives them
back to the system only when asked.

Why: a 30-minute soak at 12 calls (3 workers) saw each worker's RSS rise 6–10 % and never come
back, while 8 calls with two malloc arenas (`MALLOC_ARENA_MAX=2`) stayed flat. Each thread that allocates under
contention (pjmedia's clock, ONNX, CTranslate2, the executor) gets an arena of its own, and freed
chunks between live ones stay resident. `malloc_trim(0)` hands every arena's free pages back
(glibc ≥ 2.8 trims inside the heaps, not only their tops) without changing how anything allocates.

`MemoryKeeper` runs it in the background, at most once every `TRIM_EVERY_S` and only after a call
has ended since the last time (a quiet worker has nothing new to give back).

The cyclic garbage collector is the other half. A worker holds ~250,000 objects from its models and
libraries, and a full collection walked them all, 133 ms with the interpreter lock held: every
call's media callbacks waited (late frames). `freeze_startup_objects()` moves what exists before the
first call out of the collector's sight (`gc.freeze`), so full collections see only the calls' own
objects (0.0 ms measured after the freeze, against 133 ms before).

`limit_arenas()` caps the number of arenas as `MALLOC_ARENA_MAX` does (`malloc_arenas` in the SIP
config). It is off by default: in two 30-minute soaks at 12 calls that differed only in the cap,
2 arenas held memory no flatter (+3.0–4.6 % per worker against +2.5–3.0 %) and made frames late
2.4 times as often (1.9 % against 0.78 %): every thread then waits on the same arena locks, and on
the trim (21 ms p95 against 14 ms).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger()

TRIM_EVERY_S = 60.0
PROMPT_CACHE_MB = 32  # the voice's cache of finished sentences: about 35 minutes at 8 kHz (the config's prompt_cache_mb)


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default), in MiB, from /proc."""
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int | None = None) -> int:
    return len(os.listdir(f"/proc/{pid or 'self'}/fd"))


def libc_function(name: str):
    """A function of the C library (glibc), or None where it has none by that name (musl, macOS)."""
    path = ctypes.util.find_library("c") or "libc.so.6"
    try:
        return getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError):
        return None


_TRIM = libc_function("malloc_trim")
_MALLOPT = libc_function("mallopt")
M_ARENA_MAX = -8  # glibc's mallopt() parameter (malloc.h)
MALLOC_ARENAS = 0  # glibc's default (8 per core): a cap of 2 cost the calls their timing, see above


def limit_arenas(arenas: int) -> bool:
    """Let glibc create at most `arenas` malloc arenas from now on (0: its default, 8 per core).
    False where the C library has no such setting."""
    if not arenas or _MALLOPT is None:
        return False
    return bool(_MALLOPT(M_ARENA_MAX, arenas))


def freeze_startup_objects() -> int:
    """Collect once, then exempt every object alive now (models, modules, caches) from future
    collections; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def full_collections() -> int:
    """Full (generation 2) garbage collections so far in this process."""
    return gc.get_stats()[2]["collections"]


@dataclass
class Trimmed:
    rss_before_mb: float
    rss_after_mb: float
    ms: float


def release_free_memory() -> Trimmed | None:
    """Give the allocator's free pages back to the system; None where the C library cannot."""
    if _TRIM is None:
        return None
    before = rss_mb()
    started = time.perf_counter()
    _TRIM(0)
    return Trimmed(round(before, 1), round(rss_mb(), 1), round((time.perf_counter() - started) * 1000, 1))


class MemoryKeeper:
    """Background trimming for a worker. `call_ended()` marks that there may be something to give
    back; the trim itself runs on an executor thread, never on the event loop."""

    def __init__(self, every_s: float = TRIM_EVERY_S):
        self.every_s = every_s
        self._dirty = False
        self.trims = 0

    def call_ended(self) -> None:
        self._dirty = True

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.every_s)
            if not self._dirty:
                continue
            self._dirty = False
            trimmed = await loop.run_in_executor(None, release_free_memory)
            if trimmed is None:
                return
            self.trims += 1
            log.info("memory_trimmed", rss_before_mb=trimmed.rss_before_mb, rss_after_mb=trimmed.rss_after_mb,
                     ms=trimmed.ms, gc_full_collections=full_collections())
