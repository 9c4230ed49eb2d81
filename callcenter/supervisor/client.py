"""A small client of the control API for command-line tools (`callcenter dial`): the token from a
file, the environment or the server's recordings folder, and JSON requests with it. Standard
library only, so a command that only talks to a server loads nothing heavy."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from callcenter.errors import CallcenterError

TOKEN_ENV = "CALLCENTER_TOKEN"
REQUEST_TIMEOUT_S = 10.0


class ApiError(CallcenterError):
    """The server refused a request (its status and its words), or could not be reached."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def read_token(token_file: str | Path | None, recordings: Path = Path("recordings"), env: str = TOKEN_ENV) -> str:
    """`token_file`, else $CALLCENTER_TOKEN (or the config's `token_env`), else the server's
    recordings/.control-token. Never an argument, which every user of the machine could read in `ps`."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read the token file: {exc}") from None
    else:
        token = os.environ.get(env, "")
    if not token and (Path(recordings) / ".control-token").exists():
        token = (Path(recordings) / ".control-token").read_text().strip()
    if not token:
        raise ValueError(f"no API token: pass --token-file, set {env}, or run next to the server's "
                         "recordings/.control-token")
    return token


def request(url: str, token: str, method: str = "GET", body: dict | None = None) -> dict:
    """One JSON request to the control API; ApiError with the server's own message on refusal."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            said = json.loads(exc.read() or b"{}").get("error") or exc.reason
        except ValueError:
            said = exc.reason
        raise ApiError(f"{url}: {exc.code} {said}", exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ApiError(f"cannot reach the control API at {url}: {reason} (is `callcenter serve` running with a "
                       "control: section?)") from None
