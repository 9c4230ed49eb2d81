"""What every command module shares."""

from __future__ import annotations

from callcenter.errors import CallcenterError


class CliError(CallcenterError):
    pass


def _flow(path: str):
    from callcenter.dialog.flow import load_flow

    return load_flow(path)


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"
