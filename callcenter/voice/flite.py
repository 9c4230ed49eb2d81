"""Debian's flite as a voice: the simulated caller of `simulate` and `flows test`, and a teacher."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from callcenter.errors import CallcenterError


class FliteMissing(CallcenterError, RuntimeError):
    pass


def flite_voice(text: str, out: Path, voice: str = "kal") -> Path:
    """Caller speech from flite (Debian): a synthetic but intelligible telephone caller."""
    if not shutil.which("flite"):
        raise FliteMissing("the scripted caller's voice needs flite (apt-get install flite)")
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(out)], check=True)
    return out
