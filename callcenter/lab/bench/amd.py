"""`callcenter bench amd`: answering-machine detection measured on real outbound calls.

Reads a folder with a `manifest.jsonl` of `{"path": "person/p00.wav", "label": "person"}` (or
`"machine"`), optional `greeting_end_s` and `beep_s` (found in the audio where absent). Each WAV
(8 kHz mono 16-bit) is what the far end sends from the moment it answers. A `callcenter serve`
dials a real baresip phone per clip (`POST /api/dial`); the phone answers and plays the clip, and
records what it hears. Per clip:

- `decision` (`person`, `machine`, `unknown`): the detector's last word on the call (its `amd`
  events in the call's JSONL); `first_decision` and `revised` where a person was later taken back;
- `decision_ms`: from the end of the greeting to that decision (the detector's own clock runs from
  the first frame the far end sent);
- persons: `prompt_ms`, from the end of their greeting to the first sound of the flow's prompt in
  what the phone heard;
- machines with a beep: `message_start_ms`, from the end of the beep to the first sound of the
  message in what the phone heard (`beep_end_s` is found around `beep_s` where not given).

The summary: people taken for machines (share), machines detected (share; `unknown` counts as
missed), decision-time and message-start percentiles. `--offline` runs the detector alone on the
clips (no call, words decoded in line and delivered as late as the decode took): for tuning.

Without `--set`, the set is made first (`callcenter/lab/amd_set.py`, seed 2).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from callcenter.audio.frames import FRAME_BYTES, FRAME_MS, SAMPLE_RATE, frames_from_pcm, pcm_to_float
from callcenter.audio.stage import Moment
from callcenter.audio.wavfile import read_wav
from callcenter.call.events import read_events
from callcenter.hearing.amd import (
    MACHINE,
    PERSON,
    UNKNOWN,
    AmdSettings,
    AnsweringMachineDetector,
    Decided,
    ToneRuns,
    WantWords,
)

MANIFEST = "manifest.jsonl"
NOTE = ("Each clip is played by a real baresip phone that a `callcenter serve` dialled (POST /api/dial): "
        "decision_ms runs from the end of the greeting to the detector's last decision (negative: decided "
        "before the greeting ended, e.g. by its words); prompt_ms from a person's greeting end to the first "
        "sound of the flow's prompt the phone heard; message_start_ms from the end of the beep to the first "
        "sound of the message. The generated set's voices are flite, espeak-ng and the spectral voices, never "
        "the Asterisk recordings; its lines are clean, µ-law, white noise at 20 and 10 dB and office babble "
        "at 20 dB.")
SOUND_DB = -45.0  # a frame this loud (dBFS) in what the phone heard carries the agent's voice
BENCH_FLOW = """
name: amd-bench
voicemail_drop: >-
  Hello, this is Example Dental with a reminder of your appointment tomorrow at ten.
  Please call us back on five five five, zero one zero zero. Goodbye.
start: remind
nodes:
  remind:
    type: ask
    prompt: Hello, this is Example Dental with a reminder of your appointment tomorrow at ten. Can you make it?
    intents:
      yes: {examples: [yes, yes I can, sure, okay], next: bye}
      no: {examples: [no, I can't], next: bye}
    no_match: Sorry, can you make it tomorrow at ten?
    on_failure: bye
  bye:
    type: hangup
    text: Thank you. Goodbye.
"""


def _levels(pcm: bytes) -> np.ndarray:
    x = pcm_to_float(pcm[: len(pcm) // FRAME_BYTES * FRAME_BYTES]).reshape(-1, FRAME_BYTES // 2)
    return 10 * np.log10(np.mean(x * x, axis=1) + 1e-10)


def find_beep(pcm: bytes, near_s: float | None = None, settings: AmdSettings | None = None) -> tuple[float, float] | None:
    """(start, end) in seconds of the clip's beep (a steady tone of `beep_min_ms` or more, as the
    detector hears one), the one starting nearest `near_s` where given, else the last."""
    tones, runs = ToneRuns(settings or AmdSettings()), []
    for i, frame in enumerate(frames_from_pcm(pcm)):
        x = pcm_to_float(frame.pcm)
        beep = tones.feed(x, 10 * np.log10(float(np.mean(x * x)) + 1e-10), i * FRAME_MS / 1000)
        if beep is not None:
            runs.append((beep.start, beep.end))
    if not runs:
        return None
    if near_s is None:
        return runs[-1]
    return min(runs, key=lambda r: abs(r[0] - near_s))


def find_greeting_end(pcm: bytes, label: str, beep: tuple[float, float] | None) -> float:
    """Where the greeting ends, from the audio: a person's first stretch of speech followed by half a
    second of quiet; a machine's last sound before its beep (or its last sound)."""
    levels = _levels(pcm)
    loud = levels > max(np.percentile(levels, 10) + 12, -55)
    step = FRAME_MS / 1000
    if label == MACHINE:
        upto = int(beep[0] / step) if beep else len(loud)
        idx = np.flatnonzero(loud[:upto])
        return round((idx[-1] + 1) * step, 3) if len(idx) else 0.0
    idx = np.flatnonzero(loud)
    if not len(idx):
        return 0.0
    quiet_frames = int(0.5 / step)
    for a, b in zip(idx, idx[1:]):
        if b - a > quiet_frames:
            return round((a + 1) * step, 3)
    return round((idx[-1] + 1) * step, 3)


def first_sound_after(pcm: bytes, t: float) -> float | None:
    levels = _levels(pcm)
    i0 = int(t * 1000 / FRAME_MS)
    hits = np.flatnonzero(levels[i0:] > SOUND_DB)
    return round((i0 + hits[0]) * FRAME_MS / 1000, 3) if len(hits) else None


def read_manifest(set_dir: Path) -> list[dict]:
    rows = []
    for n, line in enumerate((set_dir / MANIFEST).read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if row.get("label") not in (PERSON, MACHINE) or not row.get("path"):
                raise ValueError(f"{set_dir / MANIFEST}:{n}: needs a path and a label of person or machine")
            rows.append(row)
    return rows


def marks(set_dir: Path, row: dict) -> dict:
    """The clip's greeting end and beep, from the manifest or found in the audio."""
    pcm = read_wav(set_dir / row["path"])
    out = {"clip_s": round(len(pcm) / (2 * SAMPLE_RATE), 3)}
    beep = None
    if row["label"] == MACHINE:
        beep = find_beep(pcm, row.get("beep_s")) if row.get("beep_s") is not None or "beep_s" not in row else None
        if row.get("beep_s") is not None and beep is None:
            beep = (row["beep_s"], row.get("beep_end_s", row["beep_s"]))
        if beep is not None:
            out["beep_s"] = row.get("beep_s", beep[0])
            out["beep_end_s"] = row.get("beep_end_s", beep[1])
    out["greeting_end_s"] = row["greeting_end_s"] if row.get("greeting_end_s") is not None else \
        find_greeting_end(pcm, row["label"], beep)
    return out


def offline_clip(pcm: bytes, stt) -> list[Decided]:
    """The detector alone on a clip: its decisions, words delivered as late as the decode took."""
    det = AnsweringMachineDetector()
    pending: list[tuple[float, str]] = []
    decided = []
    for frame in frames_from_pcm(pcm):
        events = det.process(frame, Moment(det.t))
        while pending and pending[0][0] <= det.t:
            events += det.heard(pending.pop(0)[1])
        for e in events:
            if isinstance(e, WantWords):
                t0 = time.perf_counter()
                text = stt.transcribe_pcm(e.pcm, SAMPLE_RATE).text
                pending.append((det.t + time.perf_counter() - t0, text))
                pending.sort()
            elif isinstance(e, Decided):
                decided.append(e)
        if det.done:
            break
    return decided


def _clip_record(row: dict, mark: dict, decided: list[dict]) -> dict:
    final = decided[-1] if decided else None
    rec = {"path": row["path"], "label": row["label"], "decision": final["decision"] if final else UNKNOWN,
           "decision_ms": round((final["at_s"] - mark["greeting_end_s"]) * 1000) if final else None,
           "greeting_end_s": mark["greeting_end_s"]}
    if decided and decided[0]["decision"] != rec["decision"]:
        rec.update(first_decision=decided[0]["decision"], revised=True)
    if final:
        rec["why"] = final.get("why")
    for k in ("beep_s", "beep_end_s"):
        if k in mark:
            rec[k] = mark[k]
    return rec


def summarise(clips: list[dict]) -> dict:
    persons = [c for c in clips if c["label"] == PERSON]
    machines = [c for c in clips if c["label"] == MACHINE]

    def pct(xs, q):
        return round(float(np.percentile(xs, q))) if xs else None

    person_ms = [c["decision_ms"] for c in persons if c["decision"] == PERSON and c["decision_ms"] is not None]
    machine_ms = [c["decision_ms"] for c in machines if c["decision"] == MACHINE and c["decision_ms"] is not None]
    message = [c["message_start_ms"] for c in machines if c.get("message_start_ms") is not None]
    prompt = [c["prompt_ms"] for c in persons if c.get("prompt_ms") is not None]
    out = {
        "clips": len(clips), "persons": len(persons), "machines": len(machines),
        "persons_taken_for_machines": round(sum(c["decision"] == MACHINE for c in persons) / max(1, len(persons)), 4),
        "persons_unknown": round(sum(c["decision"] == UNKNOWN for c in persons) / max(1, len(persons)), 4),
        "machines_detected": round(sum(c["decision"] == MACHINE for c in machines) / max(1, len(machines)), 4),
        "accuracy": round((sum(c["decision"] == PERSON for c in persons) + sum(c["decision"] == MACHINE
                                                                               for c in machines)) / max(1, len(clips)), 4),
        "person_decision_ms": {"p50": pct(person_ms, 50), "p95": pct(person_ms, 95), "n": len(person_ms)},
        "machine_decision_ms": {"p50": pct(machine_ms, 50), "p95": pct(machine_ms, 95), "n": len(machine_ms)},
    }
    if prompt:
        out["person_prompt_ms"] = {"p50": pct(prompt, 50), "p95": pct(prompt, 95), "n": len(prompt)}
    if message:
        out["message_start_ms"] = {"p50": pct(message, 50), "p95": pct(message, 95), "max": max(message),
                                   "n": len(message)}
    return out


def run_offline(set_dir: Path, rows: list[dict], stt) -> list[dict]:
    clips = []
    for row in rows:
        mark = marks(set_dir, row)
        decided = offline_clip(read_wav(set_dir / row["path"]), stt)
        clips.append(_clip_record(row, mark, [{"decision": d.label, "at_s": d.t, "why": d.why} for d in decided]))
    return clips


def _one_call(agent, set_dir: Path, row: dict, work: Path, port: int) -> dict:
    from callcenter.lab.fleet import control_request
    from callcenter.lab.softphone import Softphone

    mark = marks(set_dir, row)
    phone = Softphone(work, set_dir / row["path"], user="far", port=port).start()
    call_id = None
    try:
        call_id = control_request(agent.control_url, agent.token, "/api/dial",
                                  {"to": phone.uri, "flow": "amd-bench"})["call_id"]
        phone.wait_established(15)
        deadline = time.monotonic() + mark["clip_s"] + 1.0
        while time.monotonic() < deadline and "terminated" not in phone.log():
            time.sleep(0.1)
        if "terminated" not in phone.log():
            phone.hangup()
        ended = time.monotonic() + 15
        while time.monotonic() < ended and \
                control_request(agent.control_url, agent.token, f"/api/dial/{call_id}")["state"] != "ended":
            time.sleep(0.2)
    finally:
        phone.close()
    events = []
    for path in agent.recordings.glob(f"*/{call_id}.jsonl"):
        events = read_events(path)
    decided = [e for e in events if e["kind"] == "amd" and e.get("what") == "decided"]
    rec = _clip_record(row, mark, decided)
    rec["call_id"] = call_id
    heard = phone.received_wav()
    if heard is not None:
        pcm = read_wav(heard)
        if row["label"] == PERSON:
            t = first_sound_after(pcm, mark["greeting_end_s"])
            if t is not None:
                rec["prompt_ms"] = round((t - mark["greeting_end_s"]) * 1000)
        elif "beep_end_s" in mark:
            t = first_sound_after(pcm, mark["beep_end_s"])
            if t is not None:
                rec["message_start_ms"] = round((t - mark["beep_end_s"]) * 1000)
    said = [e for e in events if e["kind"] == "amd" and e.get("what") == "message"]
    rec["message_left"] = bool(said)
    return rec


def run_calls(set_dir: Path, rows: list[dict], work: Path, parallel: int = 3) -> list[dict]:
    from callcenter.lab.agent_process import AgentProcess
    from callcenter.lab.bench.call import _free_port, _free_tcp_port, _wait_warmed

    token = "bench-amd-token"
    flow = work / "amd-bench.yaml"
    flow.write_text(BENCH_FLOW)
    control = _free_tcp_port()
    agent = AgentProcess(work / "agent", _free_port(), 36000, flow, max_calls=parallel + 1, control_port=control,
                         token=token, extra_config=(f"outbound:\n  flows: {{amd-bench: {flow}}}\n"
                                                    f"  allow: ['sip:*@127.0.0.1:*']\n  ring_s: 15\n")).start()
    try:
        _wait_warmed(agent)
        with ThreadPoolExecutor(parallel) as pool:
            futures = [pool.submit(_one_call, agent, set_dir, row, work / f"phone{i}", _free_port())
                       for i, row in enumerate(rows)]
            return [f.result() for f in futures]
    finally:
        agent.stop()


def bench_amd(out: Path, set_dir: Path | None = None, offline: bool = False, limit: int | None = None,
              parallel: int = 3, seed: int = 2, clips: int = 120) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-amd-"))
    try:
        made = set_dir is None
        if made:
            from callcenter.lab.amd_set import make_set

            set_dir = make_set(tmp / "set", seed=seed, clips=clips)
        set_dir = Path(set_dir)
        rows = read_manifest(set_dir)[:limit] if limit else read_manifest(set_dir)
        t0 = time.monotonic()
        if offline:
            from callcenter.hearing.stt import WhisperStt

            results = run_offline(set_dir, rows, WhisperStt(workers=1))
        else:
            results = run_calls(set_dir, rows, tmp, parallel)
        import sys

        from callcenter.lab.bench.report import provenance

        report = {"benchmark": "answering-machine detection on real outbound calls",
                  "made_by": "callcenter " + " ".join(sys.argv[1:]), **provenance(),
                  "note": NOTE, "bench": "amd", "mode": "offline" if offline else "calls",
                  "set": f"generated (callcenter/lab/amd_set.py, seed {seed}, {clips} clips)" if made else str(set_dir),
                  "summary": summarise(results), "clips": results, "wall_s": round(time.monotonic() - t0, 1),
                  "targets": {"persons_taken_for_machines": "<= 0.02", "machines_detected": ">= 0.92",
                              "person_decision_ms.p50": "<= 1000", "message_start_ms": "<= 500"}}
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        return report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
