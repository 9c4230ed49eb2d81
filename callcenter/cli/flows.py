"""Writing and testing flows: `flows check|schema`, `test`, `simulate`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from callcenter.cli.common import CliError, _flow
from callcenter.yamlfile import UserFileError


def cmd_simulate(args) -> int:
    from callcenter.call.simulate import CallerStep, simulate_call
    from callcenter.hearing.stt import WhisperStt
    from callcenter.voice.speaker import make_tts

    flow = _flow(args.flow)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    specs = []
    for i, spec in enumerate(args.caller):
        if spec.startswith("say:"):  # a text caller: the words spoken in the scenarios' caller voice
            from callcenter.audio.frames import float_to_pcm
            from callcenter.audio.wavfile import write_wav
            from callcenter.call.caller import speak
            from callcenter.flowtest import CALLER_VOICE

            if not spec[4:].strip():
                raise CliError(f"{spec!r}: expected say:<what the caller says>")
            wav = out / f"caller-{i}.wav"
            write_wav(wav, float_to_pcm(speak(spec[4:].strip(), CALLER_VOICE)))
            spec = str(wav)
        specs.append(spec)
    try:
        steps = [CallerStep.parse(s) for s in specs]
    except ValueError as exc:
        raise CliError(str(exc)) from None
    now = None
    if args.at:
        from callcenter.flowtest import parse_at
        from callcenter.yamlfile import UserFileError

        try:
            now = parse_at(args.at)
        except UserFileError as exc:
            raise CliError(str(exc)) from None
    for s in steps:
        if s.wav and not s.wav.exists():
            raise CliError(f"{s.wav}: no such file")
    stt = WhisperStt(args.stt_model)
    tts = make_tts(flow.voice)
    from callcenter.call.caller import EchoPath

    echo = EchoPath(gain_db=-args.echo_loss) if args.echo_loss is not None else None
    call = simulate_call(flow, steps, out, stt, tts, echo=echo, **({"now": now} if now else {}))
    if args.fast:
        from callcenter.call.virtual_clock import run_virtual

        result, events = run_virtual(call)
    else:
        result, events = asyncio.run(call)
    for who, text in result.transcript:
        print(f"{who}: {text}")
    print(f"-- call ended by {result.ended_by}; recording and events in {args.out}")
    return 0


def cmd_flows_check(args) -> int:
    bad = 0
    stt = None
    for path in args.files:
        try:
            flow = _flow(path)
            warnings = list(flow.warnings)
            if args.hear:
                from callcenter.hear_back import hear_back, where
                from callcenter.hearing.stt import WhisperStt

                stt = stt or WhisperStt(args.stt_model)
                warnings += [f"{where(Path(path), m.name)}: warning: the voice's {m.name!r} was heard back as "
                             f"{m.heard!r}; callers may not understand it either: write it as it sounds, or "
                             "give the node a recorded `audio:`" for m in asyncio.run(hear_back(flow, stt))]
            for warning in warnings:
                print(warning)
            n = len(warnings)
            print(f"{path}: ok" + (f" ({n} warning{'s' if n != 1 else ''})" if n else ""))
        except UserFileError as exc:
            bad += 1
            print(str(exc))
    return 1 if bad else 0


def cmd_flows_schema(args) -> int:
    from callcenter.dialog.flow import flow_schema

    print(json.dumps(flow_schema(), indent=2))
    return 0


def cmd_test(args) -> int:
    from callcenter.flowtest import parse_at, run_scenarios

    passed, failed, _ = run_scenarios(args.files, only=args.only, json_out=Path(args.json) if args.json else None,
                                      out_root=Path(args.out) if args.out else None,
                                      at=parse_at(args.at) if args.at else None, real_time=args.real_time)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def add_simulate(sub) -> None:
    s = sub.add_parser("simulate", help="run a whole call offline from caller WAV files")
    s.add_argument("--flow", required=True)
    s.add_argument("--caller", nargs="+", required=True,
                   help="WAV files said in turn; say:TEXT says TEXT in a synthetic caller's voice; dtmf:D presses "
                        "a key (RFC 4733), tone:D plays its tone in the audio; silence:S stays quiet S seconds; "
                        "over:S:F.wav says F.wav S seconds into the agent's next prompt, over it")
    s.add_argument("--at", default=None, metavar="WHEN",
                   help="the call's clock, for hours and holidays: like 2026-12-24T18:30 Europe/London")
    s.add_argument("--echo-loss", type=float, default=None, metavar="DB",
                   help="the agent's voice echoes back on the caller's line this many dB down (e.g. 15)")
    s.add_argument("--out", required=True)
    s.add_argument("--stt-model", default=None)
    s.add_argument("--fast", action="store_true", help="on a virtual clock: the same call in the seconds its "
                                                        "computation takes (services must answer at once)")
    s.set_defaults(fn=cmd_simulate)


def add_flows(sub) -> None:
    f = sub.add_parser("flows", help="flow files").add_subparsers(dest="flows_cmd", required=True)
    s = f.add_parser("check", help="check flow files, reporting file:line:col: problem")
    s.add_argument("files", nargs="+", help="flow files (their sub-flows are checked with them)")
    s.add_argument("--hear", action="store_true",
                   help="also say every fixed sentence with a name in it in the flow's voice and transcribe it: "
                        "names the recognizer does not hear back are reported (a few seconds per flow)")
    s.add_argument("--stt-model", default=None, help="the recognizer for --hear (default: the agent's own)")
    s.set_defaults(fn=cmd_flows_check)
    s = f.add_parser("schema", help="print the JSON Schema of flow files (for yaml-language-server)")
    s.set_defaults(fn=cmd_flows_schema)


def add_test(sub) -> None:
    s = sub.add_parser("test", help="run flow scenarios: a simulated caller against a flow, with checks")
    s.add_argument("files", nargs="+", help="scenario files (flows/tests/*.yaml)")
    s.add_argument("-k", "--only", default=None, help="only scenarios whose name contains this")
    s.add_argument("--json", default=None, help="write a report here")
    s.add_argument("--out", default=None, help="folder for audio scenarios' recordings and events")
    s.add_argument("--real-time", action="store_true", help="run on the wall clock (for flows that call services "
                                                             "outside this machine); default: a virtual clock")
    s.add_argument("--at", default=None, metavar="TIME", help="the calls' clock for every scenario, e.g. "
                                                              "'2026-12-24T18:30 Europe/London'")
    s.set_defaults(fn=cmd_test)
