"""How long recordings are kept: `retention_days` in the server's config.

A call leaves a stereo WAV, its events and transcript (JSONL), and perhaps a voicemail and a
transfer leg, in `<recordings>/<YYYY-MM-DD>/`. Files last written more than `retention_days` ago
are deleted when the server starts and once a day after; day folders left empty go too. Links are
removed as links, never followed. Only what a call or the contact center writes is ever touched:
day folders (`YYYY-MM-DD`) and, in them, recordings and event files (`.wav`, `.jsonl`), and the
day's contact-center log (`contact-center-YYYY-MM-DD.jsonl`). Anything else (the queue store, the
control token, an operator's own files) stays, however old.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

import structlog

log = structlog.get_logger()

DAY_S = 86400.0
DAY_FOLDER = re.compile(r"^\d{4}-\d{2}-\d{2}$")
CALL_FILE_SUFFIXES = (".wav", ".jsonl")
CENTER_LOG = re.compile(r"^contact-center-\d{4}-\d{2}-\d{2}\.jsonl$")


def purge_recordings(root: str | Path, days: float, now: float | None = None) -> list[Path]:
    """Delete what is older than `days` under `root`; returns the paths deleted."""
    root = Path(root)
    cutoff = (time.time() if now is None else now) - days * DAY_S
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for day in sorted(root.iterdir()):
        info = day.lstat()
        if stat.S_ISDIR(info.st_mode) and DAY_FOLDER.match(day.name):
            for f in sorted(day.iterdir()):
                try:
                    info = f.lstat()
                    if info.st_mtime < cutoff and not stat.S_ISDIR(info.st_mode) \
                            and f.name.endswith(CALL_FILE_SUFFIXES) and not f.name.startswith("."):
                        f.unlink()
                        removed.append(f)
                except OSError as exc:
                    log.warning("recording_not_purged", path=str(f), error=str(exc))
            try:
                os.rmdir(day)  # only when empty
            except OSError:
                pass
        elif stat.S_ISREG(info.st_mode) and CENTER_LOG.match(day.name) and info.st_mtime < cutoff:
            day.unlink()
            removed.append(day)
    return removed
