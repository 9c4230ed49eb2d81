"""`callcenter bench stt`: hearing callers on bad phone lines, measured on `../shared/eval/` and on
lines made here (`linesim.py`). Sections (`--parts`):

- `wer`: for every condition of the evaluation set (clean, µ-law, white and babble noise at
  20/10/5 dB) and each front end — the raw line, and the streaming noise gate in front — WER of the
  embedded STT, VAD false alarms in the files' known non-speech lead-in and tail, the share of speech
  windows found, the gate's cost per frame and the decode time per utterance.
- `latency`: the whole hearing path (`replay.py`: echo canceller, gate, turn detector, decodes at
  pauses) over clean / white10 / babble10 utterances: end of speech → final transcript and → end of
  turn, p50/p95, for a node whose answer is recognised early and for an open question (the node's
  silence); WER of those finals; CPU per call-second.
- `bargein`: the agent speaks a prompt with its echo coming back (µ-law, -15 dB, 60 ms): false
  barge-ins while the caller line carries only babble or white noise at 10 dB; real interruptions
  (eval utterances, on a clean line and in babble): time from speech onset to the agent falling
  silent, to the interruption being confirmed, and misses;
  backchannels ("okay", "mm-hm") that must not stop the agent; the WER of what the interrupting
  callers were heard to say (their whole turn, first words included).
- `digits`: account numbers read out by this project's voices, clean and at 10 dB white / babble,
  recognized exactly: as a digits node decodes (`grammar`), with the written-digits prompt digits
  nodes used to give (`hint`), and plain (`free`).
- `soft`: callers trailing off in babble: each clean evaluation utterance with its last 0.35 s of
  speech 10 dB softer, in babble 10 dB under the rest (three babbles each), through the whole
  hearing path on an open question; the share whose last word (Whisper's normalizer) is in the
  turn's text, and the same with the last word at full level, for scale.
- `real`: the real-human dev set (`../shared/eval-real`: 100 prompts clean, µ-law, white and babble
  at 10 dB; 30 digit strings clean and at 10 dB white), side by side in one run: plain
  faster-whisper tiny.en (its own `transcribe`, beam 1), our recognizer on the stock tiny.en weights,
  ours on the telephone-tuned weights, and any `--compare DIR` model (Whisper base). WER per
  condition; digit strings exact through the whole live hearing path (`replay`, a digits node).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog

from callcenter.audio.frames import FRAME_SAMPLES, SAMPLE_RATE, float_to_pcm, frames_from_pcm, pcm_to_float
from callcenter.audio.stage import Moment
from callcenter.audio.wavfile import read_wav
from callcenter.hearing.denoise import Denoiser
from callcenter.hearing.vad import VAD_WINDOW_SAMPLES, SileroVad
from callcenter.lab.wer import wer, whisper_wer

log = structlog.get_logger()

EVAL_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "eval"
LEAD_S, TAIL_S = 0.3, 0.5          # the eval files' silence before and after the speech
VAD_THRESHOLD = 0.5


def load_manifest(eval_dir: Path = EVAL_DIR) -> list[dict]:
    path = eval_dir / "manifest.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the evaluation set is missing")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _front_end(pcm: bytes, denoise: bool) -> tuple[bytes, float]:
    """Audio as the recognizer gets it (time-aligned with the input) and the gate's ms per frame."""
    if not denoise:
        return pcm, 0.0
    gate = Denoiser()
    frames = list(frames_from_pcm(pcm)) + list(frames_from_pcm(bytes(int(gate.LATENCY_MS * 16) + 320)))
    started = time.perf_counter()
    out = b"".join(gate.process(f, Moment()).pcm for f in frames)
    cost = (time.perf_counter() - started) * 1000 / len(frames)
    skip = int(gate.LATENCY_MS * SAMPLE_RATE / 1000) * 2
    return out[skip:skip + len(pcm)], cost


def _vad_rates(pcm: bytes) -> tuple[int, int, int, int]:
    vad = SileroVad()
    probs = np.array(vad.feed(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768))
    centre = (np.arange(len(probs)) + 0.5) * VAD_WINDOW_SAMPLES / SAMPLE_RATE
    dur = len(pcm) / 2 / SAMPLE_RATE
    quiet = (centre < LEAD_S - 0.05) | (centre > dur - TAIL_S + 0.05)
    speech = (centre > LEAD_S + 0.2) & (centre < dur - TAIL_S - 0.2)
    fired = probs > VAD_THRESHOLD
    return int((fired & quiet).sum()), int(quiet.sum()), int((fired & speech).sum()), int(speech.sum())


PARTS = ("wer", "latency", "bargein", "digits", "soft", "real")
REAL_DIR = EVAL_DIR.parent / "eval-real"
REAL_SPEECH = ("clean", "mulaw", "white10", "babble10")
REAL_DIGITS = ("digits_clean", "digits_white10")
LINE_CONDITIONS = ("clean", "white10", "babble10")


def run_stt_bench(out: Path, limit: int | None = None, stt_model: str | None = None,
                  eval_dir: Path = EVAL_DIR, parts: tuple[str, ...] = PARTS, config=None,
                  compare: tuple[str, ...] = ()) -> dict:
    """`config` (a HearingConfig) is the call's front end for the latency and barge-in parts."""
    from callcenter.hearing.front import HearingConfig
    from callcenter.hearing.stt import WhisperStt

    config = config or HearingConfig()
    stt = WhisperStt(stt_model, workers=1)
    items = load_manifest(eval_dir)
    by_cond: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_cond[item["cond"]].append(item)
    report: dict = {"eval_dir": str(eval_dir), "front_end": {"echo_cancel": config.echo_cancel,
                                                              "denoise_vad": config.denoise_vad,
                                                              "denoise_stt": config.denoise_stt},
                    "conditions": {}}
    if "wer" in parts:
        _wer_part(report, stt, by_cond, limit, eval_dir)
    if "latency" in parts:
        report["latency"] = _latency_part(stt, by_cond, limit, eval_dir, config)
    if "bargein" in parts:
        report["bargein"] = _bargein_part(stt, by_cond, limit, eval_dir, config)
    if "digits" in parts:
        report["digits"] = _digits_part(stt, limit)
    if "soft" in parts:
        report["soft"] = _soft_part(stt, by_cond, limit, eval_dir, config)
    if "real" in parts:
        report["real"] = _real_part(stt_model, compare, limit, config)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return report


def _wer_part(report: dict, stt, by_cond: dict, limit: int | None, eval_dir: Path) -> None:
    for cond, entries in by_cond.items():
        entries = entries[:limit] if limit else entries
        report["conditions"][cond] = {}
        for denoise in (False, True):
            pairs, costs, decode = [], [], []
            fa = [0, 0, 0, 0]
            for e in entries:
                audio, cost = _front_end(read_wav(eval_dir / e["path"]), denoise)
                costs.append(cost)
                result = stt.transcribe_pcm(audio)
                decode.append(result.seconds)
                pairs.append((e["text"], result.text))
                fa = [a + b for a, b in zip(fa, _vad_rates(audio))]
            row = {
                "utterances": len(entries),
                "wer": round(wer(pairs), 4),
                "wer_whisper": _rounded(whisper_wer(pairs)),
                "vad_false_alarm": round(fa[0] / max(1, fa[1]), 4),
                "vad_speech_found": round(fa[2] / max(1, fa[3]), 4),
                "stt_decode_s_p50": round(float(np.median(decode)), 3),
            }
            if denoise:
                row["denoise_ms_per_frame_p50"] = round(float(np.median(costs)), 3)
            report["conditions"][cond]["denoised" if denoise else "raw"] = row
            log.info("stt_bench", cond=cond, denoise=denoise, **row)


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _samples(path: Path) -> np.ndarray:
    return pcm_to_float(read_wav(path))


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


def _speech_bounds(x: np.ndarray) -> tuple[float, float]:
    """Where speech starts and ends in a clean file: the first and last 20 ms frames within 35 dB
    of the loudest."""
    n = len(x) // FRAME_SAMPLES
    energy = np.mean(x[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES) ** 2, axis=1)
    loud = np.flatnonzero(energy > energy.max() * 10 ** -3.5)
    return loud[0] * FRAME_SAMPLES / SAMPLE_RATE, (loud[-1] + 1) * FRAME_SAMPLES / SAMPLE_RATE


def _onset_s(x: np.ndarray) -> float:
    return _speech_bounds(x)[0]


def _with_tail(x: np.ndarray, seconds: float) -> np.ndarray:
    """The file with its own noise tail looped on for `seconds` more: the line after the caller stops."""
    tail = x[-int(TAIL_S * SAMPLE_RATE * 0.8):]
    reps = int(np.ceil(seconds * SAMPLE_RATE / len(tail)))
    return np.concatenate([x, np.tile(tail, reps)[: int(seconds * SAMPLE_RATE)]])


def _latency_part(stt, by_cond: dict, limit: int | None, eval_dir: Path, config=None) -> dict:
    from callcenter.hearing.turns import Expectation
    from callcenter.lab.replay import replay

    node_silence_ms = 700
    scenarios = {
        "answer_recognised": Expectation("speech", node_silence_ms, answers=lambda text: bool(text.strip())),
        "open_question": Expectation("speech", node_silence_ms),
    }
    result: dict = {"node_end_silence_ms": node_silence_ms,
                    "speech_end": "last 20 ms frame of the clean recording within 35 dB of its loudest"}
    clean = {e["id"]: e for e in by_cond.get("clean", [])}
    for cond in LINE_CONDITIONS:
        entries = by_cond.get(cond, [])[: limit or None]
        for name, expect in scenarios.items():
            ready, ended, pairs = [], [], []
            cpu = audio = 0.0
            for e in entries:
                x = _samples(eval_dir / e["path"])
                speech_end = _speech_bounds(_samples(eval_dir / clean.get(e["id"], e)["path"]))[1]
                r = replay(stt, _with_tail(x, 2.5), expect=expect, tail_s=0.0, config=config)
                cpu += r.cpu_s
                audio += r.seconds
                heard = [f for f in r.finals if f.text.strip()]  # a turn of background noise read as
                if heard:                                          # nothing is not the caller's
                    ready.append((heard[-1].ready_t - speech_end) * 1000)
                    ended.append((heard[-1].ended_t - speech_end) * 1000)
                pairs.append((e["text"], " ".join(f.text for f in r.finals)))
            row = {"utterances": len(entries), "final_ms_p50": _pct(ready, 50), "final_ms_p95": _pct(ready, 95),
                   "turn_end_ms_p50": _pct(ended, 50), "turn_end_ms_p95": _pct(ended, 95),
                   "wer": round(wer(pairs), 4), "wer_whisper": _rounded(whisper_wer(pairs)),
                   "cpu_per_call_second": round(cpu / max(audio, 1e-9), 4)}
            result[f"{cond}/{name}"] = row
            log.info("stt_bench_latency", cond=cond, scenario=name, **row)
    return result


SOFT_TAIL_S, SOFT_DB, SOFT_BABBLE_SNR_DB = 0.35, 10.0, 10.0  # the trailing-off caller of `soft`
SOFT_BABBLES = (1, 2, 3)                                      # babble seeds, each utterance in each


def _soft_part(stt, by_cond: dict, limit: int | None, eval_dir: Path, config=None) -> dict:
    """Callers whose last word comes 10 dB softer, into 10 dB babble (a caller trailing off, or
    turning from the phone): is the last word in the turn's text? The same lines with the word at
    full level say how much of the loss is the softness."""
    from callcenter.hearing.turns import Expectation
    from callcenter.lab.linesim import active_rms, babble, noise_at, place
    from callcenter.lab.replay import replay
    from callcenter.lab.wer import whisper_words

    heard = {"soft": 0, "level": 0}
    cases, misses = 0, []
    for e in by_cond.get("clean", [])[: limit or None]:
        words = whisper_words(e["text"])
        if not words:
            continue
        x = _samples(eval_dir / e["path"])
        start, end = _speech_bounds(x)
        speech = x[int(start * SAMPLE_RATE):int(end * SAMPLE_RATE)].astype(np.float64)
        level = active_rms(speech)
        soft = speech.copy()
        soft[-int(SOFT_TAIL_S * SAMPLE_RATE):] *= 10 ** (-SOFT_DB / 20)
        for seed in SOFT_BABBLES:
            noise = noise_at(babble(len(speech) / SAMPLE_RATE + 4, seed=seed), level, SOFT_BABBLE_SNR_DB)
            cases += 1
            for kind, said in (("soft", soft), ("level", speech)):
                r = replay(stt, place(noise, said, 1.0), expect=Expectation("speech", 700), config=config)
                text = " ".join(f.text for f in r.finals)
                if words[-1] in whisper_words(text):
                    heard[kind] += 1
                elif kind == "soft":
                    misses.append({"id": e["id"], "babble": seed, "said": e["text"], "heard": text})
    row = {"cases": cases, "last_word_heard": round(heard["soft"] / max(cases, 1), 4),
           "last_word_heard_at_level": round(heard["level"] / max(cases, 1), 4), "misses": misses}
    log.info("stt_bench_soft", **{k: v for k, v in row.items() if k != "misses"})
    return row


PROMPTS = [
    "Thank you for calling Example Telecom. How can I help you today? You can say billing or press one, "
    "or say technical support or press two.",
    "For billing, your latest bill is in your online account, and payments made today show up within one "
    "business day.",
    "For technical support, please restart your router by unplugging it for ten seconds. Most connection "
    "problems clear up within two minutes.",
    "Is there anything else I can help you with? You can say yes or no.",
]
BACKCHANNEL_WORDS = ["Okay.", "Yeah.", "Uh-huh.", "Right.", "Sure.", "Okay, yeah."]
BACKCHANNEL_VOICES = ["flite:kal", "flite:slt", "flite:rms", "flite:awb"]  # ("mm-hm" they spell out)
INTERRUPT_AT_S = 1.0
AGENT_VOICES = ("joe", "awb", "slt")  # who reads the barge-in part's prompts, turn by turn (the spectral
# file's voices, as the part was measured with: linesim.spectral_speak)
DIGIT_VOICES = ["flite:kal", "flite:slt", "flite:rms", "flite:awb", "joe"]


@dataclass
class BargeInScene:
    """The barge-in part's material: per agent turn the prompt and its audio, and the caller of that
    turn (an eval utterance); the callers' median level and the background noises under them."""
    prompts: list[tuple[str, np.ndarray]]
    clean: list[dict]
    caller_rms: float
    noises: dict[str, np.ndarray]


def bargein_scene(by_cond: dict, eval_dir: Path, turns: int = 20) -> BargeInScene:
    from callcenter.lab.linesim import active_rms, babble, noise_at, spectral_speak, white

    prompts = [(PROMPTS[i % len(PROMPTS)], spectral_speak(PROMPTS[i % len(PROMPTS)], AGENT_VOICES[i % len(AGENT_VOICES)]))
               for i in range(turns)]
    clean = by_cond.get("clean", [])[:turns]
    caller_rms = float(np.median([active_rms(_samples(eval_dir / e["path"])) for e in clean])) if clean else 0.05
    noise_s = max(len(a) for _, a in prompts) / SAMPLE_RATE + 3
    noises = {"babble10": noise_at(babble(noise_s, seed=1), caller_rms, 10),
              "white10": noise_at(white(noise_s, seed=1), caller_rms, 10)}
    return BargeInScene(prompts, clean, caller_rms, noises)


def interruption_line(background: np.ndarray | None, agent: np.ndarray, caller: np.ndarray) -> np.ndarray:
    """The caller's line: `caller` from INTERRUPT_AT_S into the agent's prompt, over `background`
    (None: a clean line), long enough for the prompt and the caller's whole turn."""
    from callcenter.lab.linesim import place

    reach = max(len(agent), int(INTERRUPT_AT_S * SAMPLE_RATE) + len(caller))
    return place(background[:reach] if background is not None else np.zeros(reach), caller, INTERRUPT_AT_S)


def _bargein_part(stt, by_cond: dict, limit: int | None, eval_dir: Path, config=None) -> dict:
    from callcenter.call.caller import EchoPath, speak
    from callcenter.lab.linesim import active_rms, place, spectral_speak
    from callcenter.lab.replay import replay

    turns = limit or 20
    scene = bargein_scene(by_cond, eval_dir, turns)
    prompts, clean, caller_rms, noises = scene.prompts, scene.clean, scene.caller_rms, scene.noises
    result: dict = {"agent_turns": turns, "caller_rms_dbfs": round(20 * np.log10(caller_rms), 1)}

    def run(text, agent, line):
        return replay(stt, line, agent, echo=EchoPath(), agent_text=text, tail_s=1.0, config=config)

    for cond, noise in noises.items():
        false_barge = false_pause = 0
        for text, agent in prompts:
            r = run(text, agent, noise[: len(agent)])
            false_barge += r.barge_in_t is not None
            false_pause += r.agent_stopped_t is not None
        result[f"silent_caller_{cond}"] = {"false_barge_in_rate": round(false_barge / turns, 3),
                                           "false_pause_rate": round(false_pause / turns, 3)}
    for cond in ("clean", "babble10"):
        stop_ms, barge_ms, missed, heard = [], [], 0, []
        for i, (text, agent) in enumerate(prompts):
            said = clean[i % len(clean)]["text"] if clean else "Stop, I want billing."
            x = _samples(eval_dir / clean[i % len(clean)]["path"]) if clean else spectral_speak(said, "awb")
            onset = INTERRUPT_AT_S + _onset_s(x)
            r = run(text, agent, interruption_line(noises.get(cond), agent, x))
            if r.barge_in_t is None:
                missed += 1
                continue
            stop_ms.append((r.agent_stopped_t - onset) * 1000)
            barge_ms.append((r.barge_in_t - onset) * 1000)
            heard.append((said, " ".join(f.text for f in r.finals)))
        result[f"interruptions_{cond}"] = {
            "agent_silent_ms_p50": _pct(stop_ms, 50), "agent_silent_ms_p95": _pct(stop_ms, 95),
            "confirmed_ms_p50": _pct(barge_ms, 50), "missed_rate": round(missed / turns, 3),
            "wer_of_interruptions": round(wer(heard), 4) if heard else None,
            "wer_of_interruptions_whisper": _rounded(whisper_wer(heard)) if heard else None}
    false_barge = resumed = 0
    for i, (text, agent) in enumerate(prompts):
        word = speak(BACKCHANNEL_WORDS[i % len(BACKCHANNEL_WORDS)], BACKCHANNEL_VOICES[i % len(BACKCHANNEL_VOICES)])
        word = word / active_rms(word) * caller_rms
        r = run(text, agent, place(noises["babble10"][: len(agent)], word, INTERRUPT_AT_S))
        false_barge += r.barge_in_t is not None
        resumed += r.resumed > 0
    result["backchannels_babble10"] = {"false_barge_in_rate": round(false_barge / turns, 3),
                                       "resumed_rate": round(resumed / turns, 3)}
    log.info("stt_bench_bargein", **{k: v for k, v in result.items() if isinstance(v, dict)})
    return result


def _digits_part(stt, limit: int | None) -> dict:
    from callcenter.call.caller import speak
    from callcenter.lab.linesim import active_rms, babble, noise_at, white
    from callcenter.text.digits import digits_hint, spoken_digits

    count = limit or 30
    rng = np.random.default_rng(7)
    numbers = ["".join(str(d) for d in rng.integers(0, 10, int(rng.integers(6, 11)))) for _ in range(count)]
    audio = [speak(f"My account number is [digits {n}].", DIGIT_VOICES[i % len(DIGIT_VOICES)])
             for i, n in enumerate(numbers)]
    noise_s = max(len(a) for a in audio) / SAMPLE_RATE + 1
    noises = {"clean": None, "white10": white(noise_s, seed=2), "babble10": babble(noise_s, seed=2)}
    result: dict = {"numbers": count, "lengths": "6-10 digits", "voices": DIGIT_VOICES}
    from callcenter.hearing.turns import Expectation
    from callcenter.text.expecting import Expecting

    for cond, noise in noises.items():
        for mode in ("grammar", "hint", "free"):  # a digits node now; the old written-digits prompt; none
            exact = 0
            for n, a in zip(numbers, audio):
                x = a if noise is None else a + noise_at(noise, active_rms(a), 10)[: len(a)]
                hint = digits_hint(len(n)) if mode == "hint" else None
                grammar = Expectation(Expecting.DIGITS, 700, len(n), len(n)) if mode == "grammar" else None
                text = stt.transcribe_pcm(float_to_pcm(np.pad(x, (2400, 4000))), SAMPLE_RATE, hint, grammar).text
                exact += spoken_digits(text) == n
            result[f"{cond}/{mode}"] = {"exact": round(exact / count, 3)}
    log.info("stt_bench_digits", **result)
    return result


def _real_part(stt_model: str | None, compare: tuple[str, ...], limit: int | None, config) -> dict:
    """Every recognizer on the same real recordings, in the same run."""
    from callcenter.hearing.stt import STOCK, WhisperStt, resolve_model_dir
    from callcenter.hearing.turns import Expectation
    from callcenter.lab.replay import replay
    from callcenter.text.digits import spoken_digits
    from callcenter.text.expecting import Expecting

    items = load_manifest(REAL_DIR)
    by_cond: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_cond[item["cond"]].append(item)
    audio = {(e["cond"], e["id"]): pcm_to_float(read_wav(REAL_DIR / e["path"]), np.float32) for e in items}
    report: dict = {"eval_dir": str(REAL_DIR), "utterances": {c: len(by_cond[c][:limit] if limit else by_cond[c])
                                                              for c in (*REAL_SPEECH, *REAL_DIGITS)}}

    def plain_tiny():
        import soxr
        from faster_whisper import WhisperModel

        model = WhisperModel(str(resolve_model_dir(STOCK)), device="cpu", compute_type="int8", cpu_threads=1)

        def transcribe(x: np.ndarray) -> str:
            x16 = soxr.resample(x, SAMPLE_RATE, 16000).astype(np.float32)
            segments, _ = model.transcribe(x16, beam_size=1, language="en", vad_filter=False)
            return " ".join(s.text.strip() for s in segments)
        return transcribe, None

    def ours(name):
        def make():
            stt = WhisperStt(name, workers=1)
            return (lambda x: stt.transcribe(x).text), stt
        return make

    models = {"faster_whisper_tiny_en": plain_tiny, "ours_stock": ours(STOCK),
              "ours_telephone": ours(stt_model)}
    for path in compare:
        models[f"ours_{Path(path).name}"] = ours(path)
    for name, make in models.items():
        transcribe, stt = make()
        row: dict = {}
        for cond in REAL_SPEECH:
            entries = by_cond[cond][:limit] if limit else by_cond[cond]
            started = time.perf_counter()
            pairs = [(e["text"], transcribe(audio[(cond, e["id"])])) for e in entries]
            row[cond] = {"wer": round(wer(pairs), 4), "wer_whisper": _rounded(whisper_wer(pairs)),
                         "decode_s_mean": round((time.perf_counter() - started) / max(1, len(entries)), 3)}
        for cond in REAL_DIGITS:
            entries = by_cond[cond][:limit] if limit else by_cond[cond]
            exact = sum(spoken_digits(transcribe(audio[(cond, e["id"])])) == e["digits"] for e in entries)
            row[cond] = {"exact_whole_file": round(exact / max(1, len(entries)), 3)}
            if stt is not None:  # ours: through the live hearing path, on a digits node of the right length
                live = 0
                for e in entries:
                    n = len(e["digits"])
                    heard = replay(stt, audio[(cond, e["id"])].astype(np.float64),
                                   expect=Expectation(Expecting.DIGITS, 700, n, n), config=config)
                    live += spoken_digits(" ".join(f.text for f in heard.finals)) == e["digits"]
                row[cond]["exact_live"] = round(live / max(1, len(entries)), 3)
        report[name] = row
        log.info("stt_bench_real", model=name, **{c: v for c, v in row.items()})
    return report
