"""`callcenter` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from callcenter import logs
from callcenter.yamlfile import UserFileError


class CliError(Exception):
    pass


def _flow(path: str):
    from callcenter.dialog.flow import load_flow

    return load_flow(path)


def cmd_simulate(args) -> int:
    from callcenter.call.simulate import CallerStep, simulate_call
    from callcenter.hearing.stt import WhisperStt
    from callcenter.voice.espeak import make_tts

    flow = _flow(args.flow)
    try:
        steps = [CallerStep.parse(s) for s in args.caller]
    except ValueError as exc:
        raise CliError(str(exc)) from None
    for s in steps:
        if s.wav and not s.wav.exists():
            raise CliError(f"{s.wav}: no such file")
    stt = WhisperStt(args.stt_model)
    tts = make_tts(flow.voice)
    result, events = asyncio.run(simulate_call(flow, steps, Path(args.out), stt, tts))
    for who, text in result.transcript:
        print(f"{who}: {text}")
    print(f"-- call ended by {result.ended_by}; recording and events in {args.out}")
    return 0


def cmd_say(args) -> int:
    from callcenter.audio.wavfile import write_wav
    from callcenter.voice.espeak import make_tts

    tts = make_tts(args.voice)

    async def render() -> bytes:
        return b"".join([f.pcm async for f in tts.stream(args.text)])

    pcm = asyncio.run(render())
    write_wav(args.out, pcm)
    print(f"{args.out}: {len(pcm) / 16000:.2f} s at 8 kHz")
    return 0


def cmd_transcribe(args) -> int:
    from callcenter.audio.wavfile import read_wav
    from callcenter.hearing.stt import WhisperStt

    stt = WhisperStt(args.stt_model)
    for path in args.wav:
        result = stt.transcribe_pcm(read_wav(path))
        print(f"{path}\t{result.text}\t(confidence {result.confidence:.2f})" if len(args.wav) > 1 else result.text)
    return 0


def cmd_serve(args) -> int:
    from callcenter.server import serve

    return serve(args.config, args.flow, stt_model=args.stt_model)


def cmd_demo(args) -> int:
    from callcenter.demo import run_demo

    return run_demo(args.config, args.flow, Path(args.out))


def cmd_flows_check(args) -> int:
    bad = 0
    for path in args.files:
        try:
            _flow(path)
            print(f"{path}: ok")
        except UserFileError as exc:
            bad += 1
            print(str(exc))
    return 1 if bad else 0


def cmd_bench(args) -> int:
    from callcenter.bench import bench_call

    report = bench_call(calls=args.calls, flow=args.flow, out=Path(args.json), concurrent=args.concurrent)
    print(json.dumps(report["summary"], indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="callcenter", description="Telephony contact-center agent.")
    p.add_argument("--log-level", default="info")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="answer SIP calls with a flow")
    s.add_argument("--config", default="sip_configs/local.yaml")
    s.add_argument("--flow", default="flows/support.yaml")
    s.add_argument("--stt-model", default=None, help="a faster-whisper model directory (default: tiny.en)")
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("demo", help="start the agent and place a real SIP call to it with baresip")
    s.add_argument("--config", default="sip_configs/local.yaml")
    s.add_argument("--flow", default="flows/support.yaml")
    s.add_argument("--out", default="recordings/demo")
    s.set_defaults(fn=cmd_demo)

    s = sub.add_parser("simulate", help="run a whole call offline from caller WAV files")
    s.add_argument("--flow", required=True)
    s.add_argument("--caller", nargs="+", required=True, help="WAV files said in turn; dtmf:D presses a key")
    s.add_argument("--out", required=True)
    s.add_argument("--stt-model", default=None)
    s.set_defaults(fn=cmd_simulate)

    s = sub.add_parser("say", help="synthesize text to an 8 kHz WAV")
    s.add_argument("text")
    s.add_argument("--out", required=True)
    s.add_argument("--voice", default=None, help="e.g. espeak:en-us, espeak:en-gb")
    s.set_defaults(fn=cmd_say)

    s = sub.add_parser("transcribe", help="speech to text for WAV files")
    s.add_argument("wav", nargs="+")
    s.add_argument("--stt-model", default=None)
    s.set_defaults(fn=cmd_transcribe)

    f = sub.add_parser("flows", help="flow files").add_subparsers(dest="flows_cmd", required=True)
    s = f.add_parser("check", help="check flow files, reporting file:line:col: problem")
    s.add_argument("files", nargs="+")
    s.set_defaults(fn=cmd_flows_check)

    b = sub.add_parser("bench", help="benchmarks, written as JSON").add_subparsers(dest="bench_cmd", required=True)
    s = b.add_parser("call", help="scripted calls over real SIP: per-stage turn latency")
    s.add_argument("--calls", type=int, default=4)
    s.add_argument("--concurrent", type=int, default=1, help="calls in flight at once (at most 4)")
    s.add_argument("--flow", default="flows/support.yaml")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level)
    from callcenter.audio.wavfile import AudioFileError
    from callcenter.hearing.stt import SttError
    from callcenter.telephony.softphone import SoftphoneError
    from callcenter.voice.espeak import TtsError

    try:
        return args.fn(args)
    except (UserFileError, CliError, AudioFileError, SttError, TtsError, SoftphoneError) as exc:
        print(f"callcenter: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
