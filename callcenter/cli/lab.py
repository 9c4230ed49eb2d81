"""Measuring: `bench report|call|queue|soak|webrtc|tts|nlu|stt`, every result as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from callcenter.cli.common import CliError


def cmd_bench(args) -> int:
    from callcenter.lab.bench.call import CALLER_LINES, bench_call

    report = bench_call(calls=args.calls, flow=args.flow, out=Path(args.json), concurrent=args.concurrent,
                        prompt_cache_mb=args.prompt_cache_mb, stagger_s=args.stagger_s,
                        workers=args.workers, lines=tuple(args.say) if args.say else CALLER_LINES, lead_s=args.lead_s,
                        references=args.references)
    print(json.dumps(report["summary"], indent=2))
    return 0


def cmd_bench_report(args) -> int:
    from callcenter.lab.bench.report import report

    text = report(Path(args.results))
    if args.markdown == "-":
        print(text, end="")
    else:
        Path(args.markdown).write_text(text, encoding="utf-8")
        print(f"{args.markdown}: {text.count(chr(10) + '## ')} results")
    return 0


def cmd_bench_queue(args) -> int:
    from callcenter.lab.bench.queue import bench_queue

    report = bench_queue(Path(args.json), workers=args.workers, callers=args.callers, agents=args.agents,
                         hold_s=args.hold_s, stores=args.store or [])
    print(json.dumps({name: {k: v for k, v in run.items() if k != "note"} for name, run in report["stores"].items()},
                     indent=2))
    return 0


def cmd_bench_soak(args) -> int:
    from callcenter.lab.bench.call import bench_soak

    report = bench_soak(args.minutes, args.calls, args.workers, args.flow, Path(args.json),
                        memory_trim_s=args.memory_trim_s, redial_s=args.redial_s)
    print(json.dumps(report["summary"], indent=2))
    return 0


def cmd_bench_webrtc(args) -> int:
    from callcenter.lab.bench.call import bench_webrtc

    report = bench_webrtc(calls=args.calls, flow=args.flow, out=Path(args.json), codec=args.codec)
    print(json.dumps(report["summary"], indent=2))
    return 0 if not report["summary"]["failed"] else 1


def cmd_bench_tts(args) -> int:
    from callcenter.lab.bench.voice import run_tts_bench

    report = run_tts_bench(Path(args.json), args.sentences, args.voices.split(",") if args.voices else None,
                           references=not args.no_references,
                           save_audio=Path(args.save_audio) if args.save_audio else None,
                           dnsmos=not args.no_dnsmos)
    print(json.dumps({k: report[k] for k in ("voices", "references", "memory", "targets")}, indent=2))
    return 0


def cmd_bench_nlu(args) -> int:
    from callcenter.lab.bench.dialog import run_nlu_bench

    report = run_nlu_bench(Path(args.json))
    def brief(r):
        return {m: brief(v) for m, v in r.items() if m not in ("wrong_cases", "cases")} if isinstance(r, dict) else r
    print(json.dumps({k: brief(r) for k, r in report.items() if k not in ("flow", "intents")}, indent=2))
    return 0


def cmd_bench_stt(args) -> int:
    from callcenter.lab.bench.hearing import PARTS, run_stt_bench

    try:
        parts = PARTS if args.parts is None else tuple(p.strip() for p in args.parts.split(",") if p.strip())
        unknown = set(parts) - set(PARTS)
        if unknown:
            raise CliError(f"--parts: unknown {', '.join(sorted(unknown))} (choose from {', '.join(PARTS)})")
        from callcenter.hearing.front import HearingConfig

        config = HearingConfig(denoise_vad=args.vad_input == "denoised", denoise_stt=args.stt_input == "denoised")
        report = run_stt_bench(Path(args.json), args.limit, args.stt_model, parts=parts, config=config,
                               compare=tuple(args.compare))
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    print(json.dumps({k: v for k, v in report.items() if k != "eval_dir"}, indent=2))
    return 0


def cmd_bench_amd(args) -> int:
    from callcenter.lab.bench.amd import bench_amd

    report = bench_amd(Path(args.json), Path(args.set) if args.set else None, offline=args.offline, limit=args.limit,
                       parallel=args.parallel, seed=args.seed, clips=args.clips)
    print(json.dumps(report["summary"], indent=2))
    return 0


def cmd_bench_dial(args) -> int:
    from callcenter.lab.bench.dial import bench_dial

    report = bench_dial(Path(args.json), rate=args.rate, seconds=args.seconds, inbound=args.inbound)
    print(json.dumps({k: report[k] for k in ("throughput", "inbound")}, indent=2))
    return 0


def add_bench(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks, written as JSON").add_subparsers(dest="bench_cmd", required=True)
    s = b.add_parser("report", help="BENCHMARKS.md from the result JSON committed under benchmarks/results/")
    s.add_argument("--results", default="benchmarks/results", help="the folder of result JSON files")
    s.add_argument("--markdown", default="BENCHMARKS.md", help="where to write it (-: standard output)")
    s.set_defaults(fn=cmd_bench_report)
    s = b.add_parser("call", help="scripted calls over real SIP: per-stage turn latency")
    s.add_argument("--calls", type=int, default=4)
    s.add_argument("--concurrent", type=int, default=1, help="calls in flight at once (at most 4 per worker)")
    s.add_argument("--workers", type=int, default=0,
                   help="run `serve --workers N` behind Kamailio and call the balancer (0: one agent, no balancer)")
    s.add_argument("--prompt-cache-mb", type=int, default=None,
                   help="the agents' prompt cache (default: the config's, 32); 0: every call synthesises every sentence")
    s.add_argument("--stagger-s", type=float, default=0.0,
                   help="start the concurrent calls this many seconds apart (0: all at once, every caller "
                        "speaking at the same instant)")
    s.add_argument("--flow", default="flows/support.yaml")
    s.add_argument("--say", action="append", metavar="LINE",
                   help="what each caller says, in order, 11 s apart (repeat; default: a billing question, then "
                        "'No thanks, that's all')")
    s.add_argument("--lead-s", type=float, default=13.0,
                   help="when the caller first speaks, in seconds from the answer (after the flow's greeting)")
    s.add_argument("--references", action="store_true",
                   help="the same calls again with the flow's llm nodes answered by the embedding path alone, "
                        "and by a loopback OpenAI-compatible stub that answers at once (same-run references)")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench)
    s = b.add_parser("queue", help="queues of human agents behind Kamailio: agent free -> ringing, the added "
                                   "voice-to-voice cost, capacity with every slot a queued caller")
    s.add_argument("--workers", type=int, default=3)
    s.add_argument("--callers", type=int, default=12, help="callers queued at once for the capacity part")
    s.add_argument("--agents", type=int, default=3, help="baresip agent phones registered with Kamailio")
    s.add_argument("--hold-s", type=float, default=20.0, help="how long the capacity part holds them")
    s.add_argument("--store", action="append", metavar="URL",
                   help="also run it on this store (postgresql://...), beside the embedded SQLite in the same "
                        "run (repeatable)")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench_queue)
    s = b.add_parser("soak", help="calls back to back for a long time behind Kamailio: memory, handles, leaked calls")
    s.add_argument("--minutes", type=float, default=30)
    s.add_argument("--calls", type=int, default=4, help="callers at once, each calling again when done")
    s.add_argument("--workers", type=int, default=2)
    s.add_argument("--memory-trim-s", type=float, default=None,
                   help="the workers' memory_trim_s (default: the config's); 0 turns trimming off")
    s.add_argument("--redial-s", type=float, default=0.0,
                   help="mean random pause before a caller calls again (default 0: at once)")
    s.add_argument("--flow", default="flows/support.yaml")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench_soak)
    s = b.add_parser("webrtc", help="browser calls at once over WebRTC: agent CPU per call, late frames, latency")
    s.add_argument("--calls", type=int, default=1)
    s.add_argument("--codec", choices=["pcmu", "opus"], default="pcmu")
    s.add_argument("--flow", default="flows/support.yaml")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench_webrtc)
    s = b.add_parser("tts", help="voices: first audio, real-time factor, intelligibility (WER), DNSMOS, memory; "
                                 "hibari-tts, Piper, flite and espeak-ng beside them")
    s.add_argument("--sentences", type=int, default=50)
    s.add_argument("--voices", default=None, help="comma-separated ssm voices (default: all)")
    s.add_argument("--no-references", action="store_true", help="skip hibari, Piper, flite and espeak-ng")
    s.add_argument("--no-dnsmos", action="store_true", help="skip the DNSMOS judge (about 1-3 s a sentence)")
    s.add_argument("--save-audio", default=None, help="folder for a few rendered WAVs per voice")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench_tts)
    s = b.add_parser("stt", help="hearing on bad lines: WER raw and noise-gated, end-of-speech latency, "
                                 "barge-in (echo, babble, backchannels), digit strings")
    s.add_argument("--limit", type=int, default=None, help="utterances per condition / turns per section")
    s.add_argument("--parts", default=None,
                   help="sections to run, comma-separated (default: every one)")
    s.add_argument("--vad-input", choices=["raw", "denoised"], default="raw",
                   help="what turn-taking decides on in the latency and barge-in parts (default: raw)")
    s.add_argument("--stt-input", choices=["raw", "denoised"], default="raw",
                   help="what the recognizer hears in the latency and barge-in parts (default: raw)")
    s.add_argument("--stt-model", default=None,
                   help="telephone (default: tiny.en with the tuned encoder), stock, or a model directory")
    s.add_argument("--compare", action="append", default=[],
                   help="another faster-whisper model directory measured beside ours in the real part (Whisper base)")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench_stt)
    s = b.add_parser("amd", help="answering-machine detection on real outbound calls: persons taken for machines, "
                                 "machines detected, decision time, message start after the beep")
    s.add_argument("--set", default=None, help="a folder with manifest.jsonl and its WAVs (default: a generated set)")
    s.add_argument("--seed", type=int, default=2, help="the generated set's seed (without --set)")
    s.add_argument("--clips", type=int, default=120, help="the generated set's size (without --set)")
    s.add_argument("--limit", type=int, default=None, help="only the first N clips")
    s.add_argument("--parallel", type=int, default=3, help="calls at once")
    s.add_argument("--offline", action="store_true", help="the detector alone on the clips, no call (for tuning)")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench_amd)
    s = b.add_parser("dial", help="calls placed through the control API at a steady rate: calls a second "
                                  "sustained, and inbound reply time while they go on")
    s.add_argument("--rate", type=float, default=0.5, help="dials asked a second")
    s.add_argument("--seconds", type=float, default=60.0, help="how long the throughput part dials")
    s.add_argument("--inbound", type=int, default=2, help="scripted inbound calls, alone and while dialling")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench_dial)
    s = b.add_parser("nlu", help="offline intent matching on callers' own words: right / wrong intent / no match")
    s.add_argument("--json", required=True)
    s.set_defaults(fn=cmd_bench_nlu)
