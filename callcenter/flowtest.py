"""`callcenter test`: scenario files that play a caller against a flow and check what happened.

A scenario file names a flow and lists scenarios. Each scenario is a caller's steps — `say` (words),
`wav` (a recording), `keys` (keypad digits), `silence` (stay quiet until the agent reprompts) — with
inline `expect` steps (the agent said this since the caller's last step), and end-of-call checks:
what was said, the nodes passed, variables (slots, webhook results), the transfer target, who ended
the call and a latency budget per turn.

Two ways to run a scenario:
- **text** (the default): the caller's words go straight to the flow engine; webhooks and models run
  for real (webhooks against the scenario file's `http` routes, served on loopback). Turn latency is
  the time from the caller's input to the agent's first words (flow, webhook and model time).
- **audio** (`audio: true`): the whole call pipeline, as `callcenter simulate` runs it: `say` steps are
  spoken by a flite voice, heard by the turn detector and Whisper, answered by the TTS. Turn latency is
  voice to voice.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, model_validator

from callcenter.call.simulated_queue import QueueScript
from callcenter.dialog.engine import (
    Dialog,
    Enqueue,
    Fetch,
    Hangup,
    Listen,
    Record,
    Say,
    Silence,
    Think,
    Transfer,
    Waiting,
)
from callcenter.dialog.flow import DTMF_DIGITS, Flow, defined_variables, did_you_mean, load_flow
from callcenter.dialog.llm_model import installed as model_built
from callcenter.dialog.services import FlowServices
from callcenter.yamlfile import UserFileError, load_model

log = structlog.get_logger()

CALLER_VOICE = "flite:slt"  # the simulated caller's voice in audio scenarios
ESTIMATED_WORDS_PER_S = 2.5  # a text-mode voicemail's length, from its word count


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Step(_Strict):
    say: str | None = Field(None, description="The caller says this.")
    wav: str | None = Field(None, description="The caller plays this recording (audio scenarios; in text "
                                              "scenarios it is transcribed first).")
    keys: str | None = Field(None, description="Keypad digits pressed one after another, e.g. 4721#.")
    silence: float | None = Field(None, ge=0, description="Seconds the caller stays quiet (text: one no-input).")
    expect: str | list[str] | None = Field(None, description="The agent said this (case-insensitive substring) "
                                                             "since the caller's previous step.")

    @model_validator(mode="after")
    def _one(self):
        given = [k for k in ("say", "wav", "keys", "silence", "expect") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a step is exactly one of say, wav, keys, silence, expect (got {given or 'none'})")
        if self.keys is not None and (not self.keys or any(k not in DTMF_DIGITS for k in self.keys)):
            raise ValueError(f"keys must be keypad digits 0-9 * #, got {self.keys!r}")
        return self


class Expect(_Strict):
    said: list[str] = Field(default_factory=list, description="Phrases the agent said, in this order.")
    not_said: list[str] = Field(default_factory=list)
    path: list[str] = Field(default_factory=list, description="Nodes passed, in this order (others may come between).")
    not_path: list[str] = Field(default_factory=list, description="Nodes the call must not pass.")
    ends_at: str | None = Field(None, description="The last node.")
    variables: dict[str, Any] = Field(default_factory=dict, description="Variable values at the end (compared as text).")
    transfer: str | None = Field(None, description="The SIP URI the caller was transferred to, or the queue of "
                                                   "human agents (by name) whose agent answered.")
    ended_by: Literal["caller", "agent", "transfer"] | None = None
    max_turn_ms: float | None = Field(None, gt=0, description="Latency budget for every turn.")
    requests: list["ExpectedRequest"] = Field(default_factory=list, description=(
        "Requests the flow's webhooks sent to the scenario's web server, in this order (others may come "
        "between)."))


class ExpectedRequest(_Strict):
    method: Literal["GET", "POST"] | None = None
    path: str = Field(description="The request's path, without the query.")
    query: dict[str, str] = Field(default_factory=dict, description="Query parameters it must carry.")
    body: dict[str, Any] = Field(default_factory=dict, description="Fields its JSON body must carry (compared as "
                                                                   "text); other fields may be there too.")

    def matches(self, got: dict) -> bool:
        return (self.method is None or got["method"] == self.method) and got["path"] == self.path and \
            all(got["query"].get(k) == v for k, v in self.query.items()) and \
            all(isinstance(got["body"], dict) and k in got["body"] and str(got["body"][k]) == str(v)
                for k, v in self.body.items())


class Scenario(_Strict):
    name: str
    audio: bool = False
    at: dt.datetime | None = Field(None, description="The call's clock (hour, weekday), e.g. 2026-12-05 21:30.")
    variables: dict[str, Any] = Field(default_factory=dict, description="Variables set before the call starts.")
    transfer_fails: bool = Field(False, description="The SIP side refuses the transfer.")
    llm: Literal["embedding", "hybrid", "model"] = Field("embedding", description=(
        "What a `kind: local` llm node runs in this scenario, whatever this machine has built: the "
        "example phrases alone (embedding, the default), the offline model behind them (hybrid), or the "
        "model alone (model). A scenario that pins the model is skipped where it is not built."))
    queue: QueueScript = Field(default_factory=QueueScript, description=(
        "How the flow's queues of human agents behave in this scenario: an agent answers at once by "
        "default; answers_after_s: N (null: nobody comes, the queue's max_wait_s runs out), "
        "callback_after_s: N (the caller presses the callback key), agent: NAME."))
    http: dict[str, "Route"] = Field(default_factory=dict, description=(
        "Routes for this scenario only: they replace the file's routes of the same path (a 404 here, a "
        "200 in the next scenario)."))
    steps: list[Step] = Field(default_factory=list)
    expect: Expect = Field(default_factory=Expect)

    @model_validator(mode="after")
    def _checks_something(self) -> "Scenario":
        if not self.steps and self.expect == Expect():
            raise ValueError(f"scenario {self.name!r} has no steps and no expectation: it would pass whatever "
                             "the flow does")
        return self


class Route(_Strict):
    status: int = 200
    json_body: Any = Field(None, alias="json")
    text: str | None = Field(None, description="A raw reply body instead of JSON (to test garbage replies).")
    delay_s: float = Field(0, ge=0, le=60)
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class HttpStub(_Strict):
    variable: str = Field(description="The flow variable that receives this server's base URL.")
    routes: dict[str, Route] = Field(description="Path (no query) → the reply.")


Expect.model_rebuild()
Scenario.model_rebuild()


class ScenarioFile(_Strict):
    flow: str = Field(description="The flow file, relative to this file.")
    http: HttpStub | None = Field(None, description="A loopback web server that answers the flow's webhooks.")
    scenarios: list[Scenario] = Field(min_length=1)


@dataclass
class Outcome:
    name: str
    passed: bool = True
    failures: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    path: list[str] = field(default_factory=list)
    variables: dict[str, Any] = field(default_factory=dict)
    transferred_to: str | None = None
    ended_by: str | None = None
    turn_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    llm_paths: list[str] = field(default_factory=list)  # the path each llm turn took (embedding, model, ...)
    skipped: str | None = None

    def fail(self, message: str) -> None:
        self.passed = False
        self.failures.append(message)

    def report(self) -> dict:
        return {"name": self.name, "passed": self.passed, "failures": self.failures, "path": self.path,
                "said": self.said, "transferred_to": self.transferred_to, "ended_by": self.ended_by,
                "turn_ms": [round(x) for x in self.turn_ms], "seconds": round(self.seconds, 2),
                "llm_paths": self.llm_paths, "skipped": self.skipped}


# ------------------------------------------------------------------ the loopback web server
@contextlib.asynccontextmanager
async def serve_loopback(app):
    """Serve an aiohttp app on a free loopback port; yields its base URL."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


class StubServer:
    def __init__(self, stub: HttpStub):
        self.stub = stub
        self.base_url = ""
        self._serving = None
        self.routes: dict[str, Route] = dict(stub.routes)
        self.requests: list[dict] = []  # method, path, query, body of each request, in order

    def scenario(self, routes: dict[str, "Route"]) -> None:
        """The file's routes with this scenario's own on top; the request log starts empty."""
        self.routes = {**self.stub.routes, **routes}
        self.requests = []

    async def __aenter__(self) -> "StubServer":
        from aiohttp import web

        async def handle(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            self.requests.append({"method": request.method, "path": request.path, "query": dict(request.query),
                                  "body": body})
            route = self.routes.get(request.path)
            if route is None:
                return web.json_response({"error": "not found"}, status=404)
            if route.delay_s:
                await asyncio.sleep(route.delay_s)
            if route.text is not None:
                return web.Response(text=route.text, status=route.status)
            return web.json_response(route.json_body, status=route.status)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self._serving = serve_loopback(app)
        self.base_url = await self._serving.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._serving.__aexit__(*(exc or (None, None, None)))


# ------------------------------------------------------------------ text scenarios
class TextCall:
    """Drives the flow engine with a scenario's steps, carrying out its actions for real (webhooks,
    models), without audio."""

    def __init__(self, flow: Flow, scenario: Scenario, variables: dict, services: FlowServices, stt=None,
                 base: Path | None = None):
        self.dialog = Dialog(flow, variables={"call_id": "test", "caller": "sip:test@127.0.0.1", **variables},
                             now=scenario.at)
        self.scenario = scenario
        self.services = services
        self.stt = stt
        self.base = base or Path(".")
        self.out = Outcome(scenario.name)
        self.ended = False
        self.heard_since_step: list[str] = []
        self._first_word_at: float | None = None
        self._turn_started = 0.0
        self._steps = list(scenario.steps)

    def _said(self, text: str) -> None:
        if self._first_word_at is None:
            self._first_word_at = time.monotonic()
        self.out.said.append(text)
        self.heard_since_step.append(text)

    async def run(self) -> Outcome:
        t0 = time.monotonic()
        await self._carry_out(self.dialog.start())
        while self._steps and not self.ended:
            step = self._steps.pop(0)
            if step.expect is not None:
                self._check_heard(step.expect)
                continue
            self.heard_since_step = []
            self._first_word_at = None
            self._turn_started = time.monotonic()
            await self._caller(step)
            if self._first_word_at is not None:
                self.out.turn_ms.append((self._first_word_at - self._turn_started) * 1000)
        for step in self._steps:  # expectations after the call ended
            if step.expect is not None:
                self._check_heard(step.expect)
        self.out.path = list(self.dialog.path)
        self.out.variables = dict(self.dialog.variables)
        if self.out.ended_by is None:
            self.out.ended_by = "caller"
        self.out.seconds = time.monotonic() - t0
        return self.out

    def _check_heard(self, expect: str | list[str]) -> None:
        for phrase in [expect] if isinstance(expect, str) else expect:
            if not any(phrase.lower() in s.lower() for s in self.heard_since_step):
                self.out.fail(f"expected the agent to say {phrase!r}; it said {self.heard_since_step!r}")

    async def _caller(self, step: Step) -> None:
        d = self.dialog
        if self.ended or d.waiting != Waiting.CALLER:
            self.out.fail(f"the caller's step {step.model_dump(exclude_none=True)} came when the agent was not "
                          f"listening (node {d.node_name!r})")
            self.ended = True
            return
        if step.keys is not None:
            for key in step.keys:
                await self._carry_out(d.on_dtmf(key))
                if self.ended or d.waiting != Waiting.CALLER:
                    break
            return
        if step.silence is not None:
            await self._carry_out(d.on_no_input())
            return
        text = step.say
        if step.wav is not None:
            text = self._transcribe(step.wav)
            self._turn_started = time.monotonic()  # the turn starts when the words are known
        await self._carry_out(d.on_utterance(text or ""))

    def _transcribe(self, wav: str) -> str:
        from callcenter.audio.wavfile import read_wav
        from callcenter.hearing.stt import WhisperStt

        if self.stt is None:
            self.stt = WhisperStt()
        return self.stt.transcribe_pcm(read_wav(self.base / wav)).text

    async def _carry_out(self, actions) -> None:
        d = self.dialog
        for action in actions:
            if isinstance(action, Say):
                self._said(action.text)
            elif isinstance(action, (Listen, Silence)):
                pass
            elif isinstance(action, Fetch):
                r = await self.services.fetch(action)
                await self._carry_out(d.on_fetched(r.status, r.data, r.error))
            elif isinstance(action, Think):
                r = await self.services.think(action, self._said)
                self.out.llm_paths.append((r.reply.via if r.reply is not None else "") or self.services.local_path
                                          or "provider")
                await self._carry_out(d.on_thought(r.reply, r.error))
            elif isinstance(action, Record):
                while self._steps and self._steps[0].expect is not None:
                    self._check_heard(self._steps.pop(0).expect)
                message = self._steps.pop(0) if self._steps and self._steps[0].say is not None else None
                words = len(message.say.split()) if message else 0
                await self._carry_out(d.on_recorded(None, words / ESTIMATED_WORDS_PER_S))
            elif isinstance(action, Enqueue):
                result, _ = self.scenario.queue.outcome(action.settings.max_wait_s, action.settings.callback_key)
                if result == "answered":
                    self.out.transferred_to = f"queue:{action.queue}/{self.scenario.queue.agent}"
                    self.out.ended_by = "transfer"
                    self.ended = True
                else:
                    await self._carry_out(d.on_queue_left(result))
            elif isinstance(action, Transfer):
                self.out.transferred_to = action.to
                if self.scenario.transfer_fails:
                    await self._carry_out(d.on_transfer_failed())
                else:
                    self.out.ended_by = "transfer"
                    self.ended = True
            elif isinstance(action, Hangup):
                self.out.ended_by = "agent"
                self.ended = True


# ------------------------------------------------------------------ audio scenarios
async def run_audio(flow: Flow, scenario: Scenario, variables: dict, services: FlowServices, base: Path,
                    out_dir: Path, stt, tts) -> Outcome:
    from callcenter.audio.frames import float_to_pcm
    from callcenter.audio.wavfile import write_wav
    from callcenter.call.caller import speak
    from callcenter.call.events import AGENT_SAY, read_events
    from callcenter.call.latency import turn_latencies
    from callcenter.call.simulate import CallerStep, SimulatedLine, simulate_call

    out = Outcome(scenario.name)
    steps: list[CallerStep] = []
    expects: list[str] = []
    for i, step in enumerate(scenario.steps):
        if step.say is not None:
            wav = out_dir / f"caller-{i}.wav"
            write_wav(wav, float_to_pcm(speak(step.say, CALLER_VOICE)))
            steps.append(CallerStep(wav=wav))
        elif step.wav is not None:
            steps.append(CallerStep(wav=base / step.wav))
        elif step.keys is not None:
            steps += [CallerStep(digit=k) for k in step.keys]
        elif step.silence is not None:
            steps.append(CallerStep(silence_s=step.silence))
        else:
            expects += [step.expect] if isinstance(step.expect, str) else step.expect
    t0 = time.monotonic()
    line = SimulatedLine(accept_transfer=not scenario.transfer_fails, queue=scenario.queue)
    result, events = await simulate_call(flow, steps, out_dir, stt, tts, call_id="scenario", line=line,
                                         services=services, variables=variables, now=scenario.at)
    out.seconds = time.monotonic() - t0
    out.said = [e.data["text"] for e in events.history if e.kind == AGENT_SAY]
    out.path, out.variables = result.path, result.variables
    out.transferred_to, out.ended_by = result.transferred_to, result.ended_by
    out.turn_ms = [t["voice_to_voice"] * 1000 for t in turn_latencies(read_events(events.path))]
    _in_order(out, expects, "expected the agent to say")
    return out


# ------------------------------------------------------------------ checks and the command
def _in_order(out: Outcome, phrases: list[str], what: str) -> None:
    i = 0
    for phrase in phrases:
        while i < len(out.said) and phrase.lower() not in out.said[i].lower():
            i += 1
        if i == len(out.said):
            out.fail(f"{what} {phrase!r} (in order); it said {out.said!r}")
            return


def _transferred_to(got: str | None, want: str) -> bool:
    """A SIP URI as written, or a queue of agents by its name (`reception`, `queue:reception`, or
    `queue:reception/ana` for the agent who answered)."""
    if got is None:
        return False
    if got == want or got == f"queue:{want}":
        return True
    return got.startswith("queue:") and (got.split("/", 1)[0] in (want, f"queue:{want}"))


def check(out: Outcome, expect: Expect) -> None:
    _in_order(out, expect.said, "expected the agent to say")
    for phrase in expect.not_said:
        if any(phrase.lower() in s.lower() for s in out.said):
            out.fail(f"the agent said {phrase!r}, which it must not")
    i = 0
    for node in expect.path:
        while i < len(out.path) and out.path[i] != node:
            i += 1
        if i == len(out.path):
            out.fail(f"expected to pass node {node!r} (in order); the path was {out.path}")
            break
    for node in expect.not_path:
        if node in out.path:
            out.fail(f"passed node {node!r}, which it must not")
    if expect.ends_at and (not out.path or out.path[-1] != expect.ends_at):
        out.fail(f"expected to end at {expect.ends_at!r}; ended at {out.path[-1] if out.path else None!r}")
    for name, want in expect.variables.items():
        got = out.variables.get(name)
        if str(got) != str(want):
            out.fail(f"variable {name}: expected {want!r}, got {got!r}")
    if expect.transfer and not _transferred_to(out.transferred_to, expect.transfer):
        out.fail(f"expected a transfer to {expect.transfer}; got {out.transferred_to}")
    if expect.ended_by and out.ended_by != expect.ended_by:
        out.fail(f"expected the call to be ended by {expect.ended_by}; it was ended by {out.ended_by}")
    if expect.max_turn_ms is not None:
        slow = [round(ms) for ms in out.turn_ms if ms > expect.max_turn_ms]
        if slow:
            out.fail(f"turns over the {expect.max_turn_ms:.0f} ms budget: {slow} ms")


def _check_requests(out: Outcome, expected: list[ExpectedRequest], got: list[dict]) -> None:
    i = 0
    for want in expected:
        while i < len(got) and not want.matches(got[i]):
            i += 1
        if i == len(got):
            seen = "; ".join(f"{g['method']} {g['path']} {json.dumps(g['body']) if g['body'] else ''}".strip()
                             for g in got) or "none"
            out.fail(f"expected a request {want.method or ''} {want.path} with {want.body or want.query or 'anything'}"
                     f" (in order); the web server got: {seen}")
            return
        i += 1


def load_scenarios(path: str | Path) -> tuple[ScenarioFile, Flow]:
    spec, doc = load_model(path, ScenarioFile)
    flow_path = Path(path).parent / spec.flow
    flow = load_flow(flow_path)
    known = defined_variables(flow) | ({spec.http.variable} if spec.http else set())
    problems = []
    for i, scenario in enumerate(spec.scenarios):  # a typo here would set a variable nobody reads
        for where, names in (("variables", scenario.variables), ("expect", scenario.expect.variables)):
            loc = ("scenarios", i, "variables") if where == "variables" else ("scenarios", i, "expect", "variables")
            for name in names:
                if name not in known:
                    problems.append(f"{doc.where(loc + (name,))}: {name!r} is not a variable of {flow_path.name}"
                                    f"{did_you_mean(name, known)}")
    for i, scenario in enumerate(spec.scenarios):
        if (scenario.http or scenario.expect.requests) and spec.http is None:
            problems.append(f"{doc.where(('scenarios', i))}: this scenario's http routes or expected requests need "
                            "the file's http: (variable and routes)")
    if problems:
        raise UserFileError(problems)
    return spec, flow


def parse_at(text: str) -> dt.datetime:
    """`--at "2026-12-24T18:30 Europe/London"`: a time, in a zone if one is named."""
    import zoneinfo

    when, _, zone = text.strip().partition(" ")
    try:
        at = dt.datetime.fromisoformat(when)
        if zone:
            at = at.replace(tzinfo=zoneinfo.ZoneInfo(zone.strip()))
    except (ValueError, zoneinfo.ZoneInfoNotFoundError) as exc:
        raise UserFileError([f"--at {text!r}: expected like 2026-12-24T18:30 Europe/London ({exc})"]) from None
    return at


async def run_file(path: str | Path, only: str | None = None, stt=None, tts=None,
                   out_root: Path | None = None, at: dt.datetime | None = None) -> list[Outcome]:
    path = Path(path)
    spec, flow = load_scenarios(path)
    outcomes = []
    services: dict[str, FlowServices] = {}  # per llm path, shared by the file's scenarios as a server's calls share them
    stub = StubServer(spec.http) if spec.http else None
    if stub:
        await stub.__aenter__()
    try:
        for scenario in spec.scenarios:
            if only and only.lower() not in scenario.name.lower():
                continue
            if at is not None:  # the clock from the command line, for every scenario
                scenario = scenario.model_copy(update={"at": at})
            variables = dict(scenario.variables)
            if stub:
                variables.setdefault(spec.http.variable, stub.base_url)
                stub.scenario(scenario.http)
            if scenario.llm != "embedding" and not model_built():
                out = Outcome(scenario.name, skipped=f"llm: {scenario.llm} needs the offline model (./scripts/setup --llm)")
                outcomes.append(out)
                continue
            pinned = services.setdefault(scenario.llm, FlowServices(flow, local_path=scenario.llm))
            try:
                if scenario.audio:
                    if stt is None or tts is None:
                        from callcenter.hearing.stt import WhisperStt
                        from callcenter.voice.speaker import make_tts

                        stt = stt or WhisperStt()
                        tts = tts or make_tts(flow.voice)
                    root = out_root or Path(tempfile.mkdtemp(prefix="callcenter-test-"))
                    out_dir = root / _slug(path.stem) / _slug(scenario.name)
                    out = await run_audio(flow, scenario, variables, pinned, path.parent, out_dir, stt, tts)
                else:
                    out = await TextCall(flow, scenario, variables, pinned, stt, path.parent).run()
            except Exception as exc:  # one broken scenario must not hide the others' results
                log.exception("scenario_failed", scenario=scenario.name)
                out = Outcome(scenario.name)
                out.fail(f"{type(exc).__name__}: {exc}")
            else:
                check(out, scenario.expect)
                _check_requests(out, scenario.expect.requests, stub.requests if stub else [])
            outcomes.append(out)
    finally:
        if stub:
            await stub.__aexit__()
    return outcomes


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:60]


def run_scenarios(paths: list[str], only: str | None = None, json_out: Path | None = None,
                  out_root: Path | None = None, at: dt.datetime | None = None,
                  real_time: bool = False) -> tuple[int, int, list[dict]]:
    """Run scenario files; print one line per scenario. Returns (passed, failed, reports). On a
    virtual clock (call/virtual_clock.py) unless `real_time`: waits, timeouts and the caller's
    pauses take no wall time."""
    reports, passed, failed = [], 0, 0

    async def main() -> None:
        nonlocal passed, failed
        stt = tts = None
        for p in paths:
            try:
                outcomes = await run_file(p, only, stt, tts, out_root, at)
            except UserFileError as exc:
                failed += 1
                print(str(exc))
                reports.append({"file": str(p), "error": exc.problems})
                continue
            for out in outcomes:
                if out.skipped:
                    print(f"skip {p} :: {out.name}: {out.skipped}")
                    reports.append({"file": str(p), **out.report()})
                    continue
                mark = "ok  " if out.passed else "FAIL"
                turns = ", ".join(f"{ms:.0f}" for ms in out.turn_ms)
                budget = (f" ({len(out.turn_ms)} turn{'s' if len(out.turn_ms) != 1 else ''}, the agent's first "
                          f"words after {turns} ms)") if out.turn_ms else ""
                llm_note = f" [llm: {', '.join(out.llm_paths)}]" if out.llm_paths else ""
                print(f"{mark} {p} :: {out.name}{budget}{llm_note}")
                for f in out.failures:
                    print(f"     - {f}")
                passed += out.passed
                failed += not out.passed
                reports.append({"file": str(p), **out.report()})

    if real_time:
        asyncio.run(main())
    else:
        from callcenter.call.virtual_clock import run_virtual

        run_virtual(main())
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"passed": passed, "failed": failed, "scenarios": reports}, indent=2))
    return passed, failed, reports
