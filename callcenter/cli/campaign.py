"""Outbound campaigns: `callcenter campaign start FILE | pause NAME | resume NAME | status NAME`.
The campaign lives in the store; the fleet's dialer (whichever worker holds its lease) works
through it while it is running."""

from __future__ import annotations

import json
from pathlib import Path

from callcenter.cli.common import CliError

LABELS = {"no_answer": "no answer", "dnc_skipped": "do-not-call skipped", "answered": "answered (a person)"}


def _store(config: str):
    from callcenter.store.campaigns import CampaignStore
    from callcenter.store.db import open_database
    from callcenter.store.schema import migrate
    from callcenter.telephony.config import load_server_config

    cfg = load_server_config(config)
    db = open_database(cfg.store_url())
    migrate(db)
    return cfg, CampaignStore(db)


def cmd_campaign(args) -> int:
    from callcenter.store.campaigns import PAUSED, RUNNING, CampaignStoreError

    try:
        if args.campaign_cmd == "start":
            return _start(args)
        cfg, store = _store(args.config)
        if args.campaign_cmd in ("pause", "resume"):
            store.set_state(args.name, PAUSED if args.campaign_cmd == "pause" else RUNNING)
            print(f"{args.name}: {'paused' if args.campaign_cmd == 'pause' else 'running'}")
            return 0
        return _status(store, args.name, args.json)
    except CampaignStoreError as exc:
        raise CliError(str(exc)) from None


def _start(args) -> int:
    from callcenter.campaign.model import load_campaign
    from callcenter.dialog.flow import load_flow
    from callcenter.telephony.outbound import DialRefused, dial_variables

    campaign, contacts, dnc = load_campaign(args.file)
    cfg, store = _store(args.config)
    if cfg.outbound is None or campaign.flow not in cfg.outbound.flows:
        known = ", ".join(sorted(cfg.outbound.flows)) if cfg.outbound else "none (no outbound: section)"
        raise CliError(f"{args.file}: flow {campaign.flow!r} is not an outbound flow of {args.config} "
                       f"(outbound.flows: {known})")
    flow = load_flow(cfg.outbound_flow(campaign.flow))
    for i, (_, _, variables) in enumerate(contacts, 2):
        try:
            dial_variables(variables, flow)
        except DialRefused as exc:
            raise CliError(f"{Path(args.file).parent / campaign.contacts}:{i}: {exc}") from None
    store.create(campaign.name, str(Path(args.file).resolve()), campaign.flow, campaign.settings(), contacts, dnc)
    print(f"{campaign.name}: {len(contacts)} contacts, running (the fleet's dialer starts on them within a second)")
    return 0


def _status(store, name: str, json_path: str | None) -> int:
    summary = store.summary(name)
    campaign, counts = store.campaign(name), summary["counts"]
    print(f"{name}: {summary['state']}, flow {summary['flow']}")
    for key, value in counts.items():
        print(f"  {LABELS.get(key, key):<20} {value}")
    if json_path:
        contacts, attempts = store.contacts(name), store.attempts(name)
        out = {"campaign": {k: v for k, v in summary.items() if k != "counts"}, "settings": campaign["settings"],
               "counts": counts,
               "contacts": [{"row": c.row_no, "number": c.number, "timezone": c.timezone, "state": c.state,
                             "attempts": c.attempts, "result": c.result, "call_id": c.call_id,
                             "next_at": c.next_at} for c in contacts],
               "attempts": [{"row": r, "attempt": a, "call_id": cid, "result": res} for r, a, cid, res in attempts]}
        Path(json_path).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def add_campaign(sub) -> None:
    s = sub.add_parser("campaign", help="outbound campaigns: start one from a file, pause, resume, see how it goes")
    cs = s.add_subparsers(dest="campaign_cmd", required=True)
    start = cs.add_parser("start", help="load a campaign file and its contacts into the store, running")
    start.add_argument("file", help="the campaign file (flows/campaigns/*.yaml)")
    for name, help_ in (("pause", "stop dialling new calls (calls in progress go on)"),
                        ("resume", "dial again"), ("status", "counts by result, and what remains")):
        c = cs.add_parser(name, help=help_)
        c.add_argument("name", help="the campaign's name")
        if name == "status":
            c.add_argument("--json", default=None, metavar="PATH", help="also write every contact and attempt here")
    for c in (start, *[cs.choices[n] for n in ("pause", "resume", "status")]):
        c.add_argument("--config", required=True, help="the server config (its store, its outbound flows)")
    s.set_defaults(fn=cmd_campaign)



