"""Running the contact center: `serve`, `kamailio-config`, `store`, `calls`, `demo`, `tui`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from callcenter.cli.common import CliError
from callcenter.telephony.kamailio import PIKE_DENSITY, PIKE_UNIT_S


def cmd_serve(args) -> int:
    if args.workers > 1:
        from callcenter.workers import WorkerPool

        return WorkerPool(args.config, args.flow, args.workers, args.stt_model).run()
    from callcenter.server import serve

    return serve(args.config, args.flow, stt_model=args.stt_model)


def cmd_kamailio_config(args) -> int:
    from callcenter.telephony.config import load_server_config
    from callcenter.telephony.kamailio import write_kamailio_config
    from callcenter.workers import worker_uris

    workers = list(args.worker or [])
    if args.config:
        workers += worker_uris(load_server_config(args.config), args.workers)
    if not workers:
        raise CliError("name the workers: --config CONFIG --workers N (as serve --workers N runs them), "
                       "or --worker sip:HOST:PORT for each")
    from callcenter.telephony.kamailio import callers_from_env

    try:
        callers = callers_from_env(args.caller or [])
        agents = callers_from_env(args.agent or [], "--agent")
        db = None
        if args.db:
            from callcenter.store.url import StoreUrl

            if args.db == "store":
                if not args.config:
                    raise CliError("--db store needs --config (the server config whose store: Kamailio shares)")
                db = load_server_config(args.config).store_url()
            else:
                db = StoreUrl.parse(args.db)
        cfg = write_kamailio_config(args.out, args.listen, workers, callers=callers, realm=args.realm,
                                    pike_density=args.rate_limit, agents=agents,
                                    agent_networks=args.agent_network or [], db=db)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(f"{cfg} (dispatcher list beside it): kamailio -DD -E -f {cfg}")
    if agents:
        print(f"each worker's config needs `trusted_proxies: ['{args.listen}']` to take agents' keypad codes "
              "from this balancer")
    return 0


def cmd_store(args) -> int:
    """store check: 0 current, 1 migrations pending, 2 unreachable; store migrate: apply them."""
    from callcenter.store.db import StoreError, open_database
    from callcenter.store.schema import LATEST, current_version, migrate, pending
    from callcenter.telephony.config import load_server_config

    url = load_server_config(args.config).store_url()
    try:
        db = open_database(url)
        if args.store_cmd == "migrate":
            done = migrate(db)
            print(f"{url.display}: at version {LATEST}" + (f" (applied {', '.join(str(m.version) for m in done)})"
                                                           if done else " (nothing to do)"))
            return 0
        todo = pending(db)
        print(f"{url.display}: version {current_version(db)}, latest {LATEST}"
              + (f"; pending: {', '.join(f'{m.version} {m.name}' for m in todo)} (callcenter store migrate)"
                 if todo else "; current"))
        return 1 if todo else 0
    except StoreError as exc:
        print(f"callcenter: {exc}", file=sys.stderr)
        return 2


def cmd_calls_list(args) -> int:
    """The calls of a period, from the store (every worker, every host): a line each, or JSON."""
    import datetime as dt

    from callcenter.store.calls import CallRecords
    from callcenter.store.db import open_database
    from callcenter.store.period import period
    from callcenter.telephony.config import load_server_config

    since, until = period(args.since, args.until)
    db = open_database(load_server_config(args.config).store_url())
    calls = CallRecords(db, "", "").between(since, until)
    if args.json:
        Path(args.json).write_text(json.dumps({"since": since, "until": until, "calls": calls}, indent=1) + "\n")
    for c in calls:
        when = dt.datetime.fromtimestamp(c["started"]).strftime("%Y-%m-%d %H:%M:%S")
        length = f"{c['ended'] - c['started']:.0f}s" if c["ended"] else "live"
        caller = c["caller_number"] or c["caller"] or "-"
        print(f"{when}  {length:>6}  {c['outcome'] or 'in progress':<18}  {caller:<16}  {c['flow']:<14}  "
              f"{c['host']}/{c['worker']}  {c['call_id']}")
    print(f"{len(calls)} calls", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from callcenter.lab.demo import run_demo

    for what, path in (("--config", args.config), ("--flow", args.flow)):
        if not Path(path).is_file():
            raise CliError(f"{path}: no such file ({what}); run the demo from the repository's folder, or "
                           f"name the files with --config and --flow")
    return run_demo(args.config, args.flow, Path(args.out))


def cmd_tui(args) -> int:
    from callcenter.supervisor.tui import run_tui

    if args.token is not None:
        raise CliError("the token is not taken on the command line, where every user sees it in `ps`: "
                       "put it in a file (--token-file F) or in $CALLCENTER_TOKEN")
    urls = list(args.connect or [])
    recordings = Path(args.recordings)
    try:
        if args.config:  # the fleet: every live worker the store knows, on every host
            from callcenter.telephony.config import load_server_config
            from callcenter.workers import fleet_control_urls, worker_control_urls

            cfg = load_server_config(args.config)
            found = fleet_control_urls(cfg) if args.workers is None else []
            urls += found or worker_control_urls(cfg, args.workers or 1)
            recordings = Path(cfg.recordings)
        return run_tui(urls or ["http://127.0.0.1:8470"], args.token_file, recordings)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def add_serve(sub) -> None:
    s = sub.add_parser("serve", help="answer SIP calls with a flow")
    s.add_argument("--config", default="sip_configs/local.yaml",
                   help="the server config: SIP, media, store, control API, contact center (default %(default)s)")
    s.add_argument("--flow", default="flows/support.yaml", help="the flow every call runs (default %(default)s)")
    s.add_argument("--stt-model", default=None, help="a faster-whisper model directory (default: tiny.en)")
    s.add_argument("--workers", type=int, default=1,
                   help="run N supervised worker processes on ports listen.port+i (put Kamailio in front)")
    s.set_defaults(fn=cmd_serve)


def add_kamailio_config(sub) -> None:
    s = sub.add_parser("kamailio-config", help="write a Kamailio load-balancer config for the workers")
    s.add_argument("--config", default=None, help="the SIP config serve --workers uses")
    s.add_argument("--workers", type=int, default=2)
    s.add_argument("--worker", action="append", help="a worker's SIP URI (sip:10.0.0.5:5062), repeatable")
    s.add_argument("--listen", default="127.0.0.1:5060", help="where Kamailio listens (host:port)")
    s.add_argument("--out", default="build/kamailio")
    s.add_argument("--caller", action="append", metavar="USER=ENV_VAR",
                   help="require digest authentication of INVITEs; this caller's password is in ENV_VAR (repeatable)")
    s.add_argument("--agent", action="append", metavar="USER=ENV_VAR",
                   help="a human agent whose softphone registers here (digest authentication; password in "
                        "ENV_VAR); workers ring them at sip:USER@LISTEN (repeatable)")
    s.add_argument("--agent-network", action="append", metavar="CIDR",
                   help="a network an agent's phone may register a contact in besides its own address "
                        "(repeatable; default: only the address the REGISTER came from)")
    s.add_argument("--db", default=None, metavar="URL|store",
                   help="keep callers, agents, their registrations and the workers in PostgreSQL (a "
                        "postgresql:// URL, or `store`: the --config's store) instead of the config and "
                        "Kamailio's memory: a restart loses no registration, a worker joins by a row")
    s.add_argument("--realm", default="callcenter", help="the digest realm")
    s.add_argument("--rate-limit", type=int, default=PIKE_DENSITY, metavar="N",
                   help=f"requests one address (not a worker) may send per {PIKE_UNIT_S} s before Kamailio "
                        f"blocks it for a while (pike; default {PIKE_DENSITY})")
    s.set_defaults(fn=cmd_kamailio_config)


def add_store(sub) -> None:
    s = sub.add_parser("store", help="the system of record: check its schema, apply migrations")
    st = s.add_subparsers(dest="store_cmd", required=True)
    for name, helptext in (("check", "exit 0: current, 1: migrations pending, 2: unreachable"),
                           ("migrate", "apply the pending migrations (every worker also does at start)")):
        v = st.add_parser(name, help=helptext)
        v.add_argument("--config", required=True, help="the server config whose `store:` to use")
        v.set_defaults(fn=cmd_store)


def add_calls(sub) -> None:
    s = sub.add_parser("calls", help="past and live calls, from the store")
    cs = s.add_subparsers(dest="calls_cmd", required=True)
    v = cs.add_parser("list", help="the calls of a period with their outcomes, across every worker and host")
    v.add_argument("--config", required=True, help="the server config whose `store:` to read")
    v.add_argument("--since", default="today", help="today, yesterday, 7d, 24h, or an ISO date or time (default today)")
    v.add_argument("--until", default=None, help="the same grammar; default now")
    v.add_argument("--json", default=None, metavar="PATH", help="also write the calls as JSON")
    v.set_defaults(fn=cmd_calls_list)
    from callcenter.cli.report import add_calls_score, add_calls_search

    add_calls_search(cs)
    add_calls_score(cs)


def add_demo(sub) -> None:
    s = sub.add_parser("demo", help="start the agent and place a real SIP call to it with baresip")
    s.add_argument("--config", default="sip_configs/local.yaml", help="the server config (default %(default)s)")
    s.add_argument("--flow", default="flows/support.yaml", help="the flow the demo call runs (default %(default)s)")
    s.add_argument("--out", default="recordings/demo", help="where the demo call's recordings go (default %(default)s)")
    s.set_defaults(fn=cmd_demo)


def add_tui(sub) -> None:
    s = sub.add_parser("tui", help="the supervisor's console: live calls, transcripts, latency, actions")
    s.add_argument("--connect", action="append", metavar="URL",
                   help="an agent server's control API (repeat for several; default http://127.0.0.1:8470)")
    s.add_argument("--token-file", default=None, metavar="FILE",
                   help="read the API token from FILE (default: $CALLCENTER_TOKEN, else "
                        "recordings/.control-token); never on the command line, where `ps` shows it")
    s.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused: see cmd_tui
    s.add_argument("--recordings", default="recordings", help="where to look for .control-token")
    s.add_argument("--config", default=None, help="connect to every live worker of the fleet this server config's "
                                                   "store knows, on every host")
    s.add_argument("--workers", type=int, default=None,
                   help="with --config: connect to this many workers of `serve --workers N` on this machine "
                        "(control ports control.port + i) instead of asking the store")
    s.set_defaults(fn=cmd_tui)
