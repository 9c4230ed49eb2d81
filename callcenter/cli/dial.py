"""Calling out: `callcenter dial`, which asks a running server to place a call."""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
from pathlib import Path

from callcenter.cli.common import CliError

WAIT_POLL_S = 0.5


def _server(args) -> tuple[str, str]:
    """The control API to ask, and its token: --connect, else the config's (a live worker the
    store knows, else control.host:port), else the default."""
    from callcenter.supervisor.client import TOKEN_ENV, read_token

    recordings, env = Path(args.recordings), TOKEN_ENV
    url = args.connect
    if args.config:
        from callcenter.telephony.config import load_server_config
        from callcenter.workers import fleet_control_urls, worker_control_urls

        cfg = load_server_config(args.config)
        try:
            url = url or (fleet_control_urls(cfg) or worker_control_urls(cfg, 1))[0]
        except ValueError as exc:
            raise CliError(str(exc)) from None
        recordings, env = Path(cfg.recordings), cfg.control.token_env if cfg.control else TOKEN_ENV
    try:
        return (url or "http://127.0.0.1:8470").rstrip("/"), read_token(args.token_file, recordings, env)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _variables(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"--var {pair!r}: give name=value")
        out[name] = value
    return out


def cmd_dial(args) -> int:
    """Print the call id; with --wait, block until the call ends and exit 1 if nobody answered."""
    from callcenter.supervisor.client import request

    url, token = _server(args)
    placed = request(f"{url}/api/dial", token, "POST",
                     {"to": args.to, "flow": args.flow, "variables": _variables(args.var or [])})
    call_id = placed["call_id"]
    print(call_id, flush=True)
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.timeout
    state = placed
    while state.get("state") != "ended":
        if time.monotonic() > deadline:
            print(f"callcenter: call {call_id} still {state.get('state')} after {args.timeout:.0f} s", file=sys.stderr)
            return 1
        time.sleep(WAIT_POLL_S)
        state = request(f"{url}/api/dial/{urllib.parse.quote(call_id)}", token)
    print(json.dumps(state), flush=True)
    from callcenter.store.calls import UNANSWERED

    return 1 if state.get("outcome") in UNANSWERED else 0


def add_dial(sub) -> None:
    s = sub.add_parser("dial", help="ask a running server to call a number or SIP URI and run an outbound flow",
                       description="Place a call through a running server's control API (its outbound: section "
                                   "names the flows a dial may run and the destinations it may dial).")
    s.add_argument("to", help="a phone number (+14155550100; sent to outbound.trunk) or a SIP URI")
    s.add_argument("--flow", required=True, help="the outbound flow to run: a name in the config's outbound.flows")
    s.add_argument("--var", action="append", metavar="NAME=VALUE",
                   help="a variable the flow declares (repeat for several)")
    s.add_argument("--connect", default=None, metavar="URL",
                   help="the server's control API (default: from --config, else http://127.0.0.1:8470)")
    s.add_argument("--config", default=None, help="the server config: its control API (a live worker the store "
                                                   "knows), its token variable and recordings folder")
    s.add_argument("--token-file", default=None, metavar="FILE",
                   help="read the API token from FILE (default: $CALLCENTER_TOKEN, else recordings/.control-token)")
    s.add_argument("--recordings", default="recordings", help="where to look for .control-token")
    s.add_argument("--wait", action="store_true", help="block until the call ends; exit 1 if nobody answered")
    s.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                   help="with --wait: give up waiting after S seconds (exit 1; the call goes on)")
    s.set_defaults(fn=cmd_dial)
