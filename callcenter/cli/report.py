"""`callcenter report`: how a period went, from the store, as HTML with plots, CSV or JSON."""

from __future__ import annotations

import datetime as dt
import re
import sys
from pathlib import Path

from callcenter.cli.common import CliError


def _until(text: str) -> float:
    """--to is inclusive: a date means the end of that day."""
    from callcenter.store.period import moment

    end = moment(text)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text.strip()) or text.strip().lower() in ("today", "yesterday"):
        end += dt.timedelta(days=1)
    return end.timestamp()


def cmd_report(args) -> int:
    from callcenter.reports.figures import INTERVALS, report
    from callcenter.reports.render import as_csv, as_html, as_json
    from callcenter.store.calls import CallRecords
    from callcenter.store.db import open_database
    from callcenter.store.period import moment
    from callcenter.store.schema import migrate
    from callcenter.telephony.config import load_server_config

    since = moment(args.from_).timestamp()
    until = min(_until(args.to), dt.datetime.now().timestamp())  # nothing happened after now
    if until <= since:
        raise CliError(f"--to {args.to} is before --from {args.from_}")
    db = open_database(load_server_config(args.config).store_url())
    migrate(db)
    rows = CallRecords(db, "", "").between(since, until)
    levels = {name: s for name, s in db.execute("SELECT name, service_level_s FROM queues")}
    rep = report(rows, since, until, INTERVALS[args.interval], levels)
    text = {"json": as_json, "csv": as_csv, "html": as_html}[args.format](rep)
    if args.out:
        Path(args.out).write_text(text)
        print(f"{args.out}: {rep['totals']['offered']} calls offered, {len(rows)} calls in all", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def add_report(sub) -> None:
    s = sub.add_parser("report", help="how a period went: calls, outcomes, queues, agents, funnels, reply times",
                       description="A report from the store (every worker, every host). Dates are inclusive, in "
                                   "the server's time zone, in the grammar of `calls list`.")
    s.add_argument("--config", required=True, help="the server config whose `store:` to read")
    s.add_argument("--from", dest="from_", default="today",
                   help="today, yesterday, 7d, 24h, or an ISO date or time (default today)")
    s.add_argument("--to", default="today", help="the same grammar, inclusive: a date means its whole day "
                                                 "(default today)")
    s.add_argument("--interval", choices=("15m", "1h", "1d"), default="1h", help="one line or bar per (default 1h)")
    s.add_argument("--format", choices=("html", "csv", "json"), default="html")
    s.add_argument("--out", default=None, metavar="FILE", help="write here (default: stdout)")
    s.set_defaults(fn=cmd_report)


def cmd_calls_search(args) -> int:
    """The calls of a period that hold every word of the query: a line each, or JSON."""
    from callcenter.reports.search import search, words_of
    from callcenter.store.calls import CallRecords
    from callcenter.store.db import open_database
    from callcenter.store.period import period
    from callcenter.store.schema import migrate
    from callcenter.telephony.config import load_server_config

    if not words_of(args.query):
        raise CliError("search for at least one word")
    since, until = period(args.since, args.until)
    db = open_database(load_server_config(args.config).store_url())
    migrate(db)
    found = search(CallRecords(db, "", "").between(since, until), args.query)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"query": args.query, "since": since, "until": until,
                                               "calls": [f.as_dict() for f in found]}, indent=1) + "\n")
    for f in found:
        c = f.call
        when = dt.datetime.fromtimestamp(c["started"]).strftime("%Y-%m-%d %H:%M")
        print(f"{when}  {c['outcome'] or 'in progress':<18}  {c['caller_number'] or c['caller'] or '-':<16}  "
              f"{c['call_id']}  {f.snippet}")
    print(f"{len(found)} calls", file=sys.stderr)
    return 0


def add_calls_search(calls_sub) -> None:
    s = calls_sub.add_parser("search", help="past calls whose transcript, summary or fields hold every word")
    s.add_argument("query", help='the words, e.g. "router broken" (every one must be in the call)')
    s.add_argument("--config", required=True, help="the server config whose `store:` to read")
    s.add_argument("--since", default="7d", help="today, yesterday, 7d, 24h, or an ISO date or time (default 7d)")
    s.add_argument("--until", default=None, help="the same grammar; default now")
    s.add_argument("--json", default=None, metavar="PATH", help="also write the calls found as JSON")
    s.set_defaults(fn=cmd_calls_search)


def cmd_calls_score(args) -> int:
    """A supervisor's own score for one item of a call's scorecard, with a note."""
    import getpass

    from callcenter.store.calls import CallRecords
    from callcenter.store.db import open_database
    from callcenter.store.schema import migrate
    from callcenter.telephony.config import load_server_config

    db = open_database(load_server_config(args.config).store_url())
    migrate(db)
    try:
        scores = CallRecords(db, "", "").override_score(args.call_id, args.item, args.score == "pass", args.note,
                                                        args.by or getpass.getuser())
    except KeyError as exc:
        raise CliError(str(exc.args[0])) from None
    total = scores.get("total")
    print(f"{args.call_id}: {args.item} {args.score} (was {scores['items'][args.item]['score']}); "
          f"total {'-' if total is None else f'{total * 100:.0f}%'}")
    return 0


def add_calls_score(calls_sub) -> None:
    s = calls_sub.add_parser("score", help="override one item of a call's quality scorecard, with a note")
    s.add_argument("call_id")
    s.add_argument("item", help="the scorecard item, e.g. greeted")
    s.add_argument("score", choices=("pass", "fail"))
    s.add_argument("--note", required=True, help="why (kept beside the automatic score)")
    s.add_argument("--by", default=None, help="who (default: your user name)")
    s.add_argument("--config", required=True, help="the server config whose `store:` to use")
    s.set_defaults(fn=cmd_calls_score)
