"""`callcenter` command line, by audience: running the contact center (`run`), writing and
testing flows (`flows`), the voices and models (`voice`), measuring (`lab`)."""

from __future__ import annotations

import argparse
import os
import sys

from callcenter import logs
from callcenter.cli import campaign, dial, flows, lab, report, run, voice
from callcenter.cli.common import CliError
from callcenter.errors import CallcenterError

__all__ = ["CliError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="callcenter", description="Telephony contact-center agent.")
    p.add_argument("--log-level", default="info")
    sub = p.add_subparsers(dest="cmd", required=True)

    run.add_serve(sub)
    run.add_kamailio_config(sub)
    run.add_store(sub)
    run.add_calls(sub)
    report.add_report(sub)
    run.add_demo(sub)
    flows.add_simulate(sub)
    voice.add_say(sub)
    voice.add_voice(sub)
    voice.add_llm(sub)
    voice.add_stt(sub)
    voice.add_transcribe(sub)
    flows.add_flows(sub)
    run.add_tui(sub)
    dial.add_dial(sub)
    campaign.add_campaign(sub)
    flows.add_test(sub)
    lab.add_bench(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level)

    try:
        return args.fn(args)
    except CallcenterError as exc:
        print(f"callcenter: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `callcenter calls list | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
