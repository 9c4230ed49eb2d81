"""The control and event API of an agent server, for the supervisor's console and other tools.

aiohttp, on loopback by default, every request authenticated with a bearer token
(`Authorization: Bearer T`; `?token=T` only on the WebSocket, for clients that cannot set headers).
A browser may open the WebSocket only from a page in `control.allowed_origins`. Bound to any other
address than loopback, the API speaks plain HTTP: put a TLS proxy in front (the server says so loudly).

- `GET  /api/calls` — the live calls: caller, flow and node, state, duration, last intent, levels.
- `GET  /api/calls/history?since=yesterday[&until=today][&limit=N]` — past and live calls from the
  store, across every worker and host, each with its outcome (the grammar of `callcenter calls list`).
- `GET  /api/events` (WebSocket) — first `{"type": "hello", "calls": [...], "history": {call_id: [events]}}`,
  then every call's events as they happen (`{"type": "event", "event": {...}}`, the same JSON as the
  recordings' JSONL) and a `{"type": "calls", "calls": [...]}` table once a second.
- `POST /api/calls/{id}/{action}` — `say {"text"}` (the agent speaks the sentence in the call's voice),
  `take_over`, `release`, `pause`, `resume`, `transfer {"to"}|{"queue"}|{"agent"}`, `hangup`, `mark {"note"}`;
  supervisor audio on a SIP call: `listen`, `whisper`, `barge` `{"phone"}` (the supervisor's phone is
  called the first time — `phone` or the config's `control.supervisor_phone` — then each is an
  instant switch), `leave`.
- `POST /api/dial` `{"to", "flow", "variables"}` — place a call to a number or SIP URI that runs one
  of the server's outbound flows (`outbound.flows`), if `outbound.allow` lets it: 201
  `{"call_id", "state"}`; 403 not allowed, 404 no such flow, 400 bad variables, 503 no free slot,
  502 the call could not be placed.
- `GET  /api/dial/{id}` — a dialled call: `state` (dialling, ringing, answered, ended), `outcome`
  (`no_answer`, `busy`, `failed`, or its flow's outcome once over), `sip_code`, `ended_by`.
- `GET  /api/dead-letters` — end-of-call webhooks that never got through: call, URL, attempts, the last
  error, when (newest first, 100 at most).
- `GET  /api/campaigns` — every outbound campaign in the store: state, flow, and its counts (contacts,
  dialled, calls, answered, machine, no answer, busy, failed, do-not-call skipped, refused, remaining).
- `GET  /api/queues` — with a contact center: every queue (waiting, longest wait, agents available,
  busy and paused, answered, abandoned, timed out and called back today, service level) and every
  human agent (state, reason, time in state). The WebSocket sends it as `{"type": "queues", ...}`
  with the calls table.
- `POST /api/agents/{name}/{action}` — `login`, `logout`, `pause {"reason"}`, `resume` (409 while the
  agent rings or talks); sent to consoles as an `agent_state` event.
- `GET  /api/flows` — the flow being served: name, version, digest, the checker's errors of a rejected edit.
- `GET  /api/recordings[?limit=N]` (each with its caller, outcome and summary from the store),
  `GET /api/recordings/{day}/{name}` (events),
  `GET /api/recordings/{day}/{name}.wav` — past calls.

A slow or stuck client never holds a call up: each WebSocket has a bounded queue and loses its
oldest messages (and is told how many) when it falls behind.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Protocol

import structlog
from aiohttp import WSMsgType, web

from callcenter.dialog.flow import SIP_URI
from callcenter.errors import CallcenterError
from callcenter.metrics import CONTENT_TYPE

log = structlog.get_logger()

CLIENT_QUEUE = 5000  # messages a WebSocket client may fall behind before its oldest are dropped
TABLE_EVERY_S = 1.0
MAX_SAY_CHARS = 500
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
EVENTS_PATH = "/api/events"
METRICS_PATH = "/metrics"  # Prometheus text format (callcenter/metrics.py)
ACTIONS = ("say", "take_over", "release", "pause", "resume", "transfer", "hangup", "mark",
           "listen", "whisper", "barge", "leave")


async def _json_body(request: web.Request) -> dict | web.Response:
    """The request's JSON object (empty without a body), or the 400 to answer."""
    try:
        body = await request.json() if request.can_read_body else {}
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
    except ValueError as exc:
        return web.json_response({"error": f"bad JSON body: {exc}"}, status=400)
    except RecursionError:
        return web.json_response({"error": "bad JSON body: nested too deeply"}, status=400)
    return {k: _clean(v) for k, v in body.items()}


class Control(Protocol):
    """The control API's settings, as this module reads them (the server config's `control:`)."""
    host: str
    port: int
    token_env: str
    allowed_origins: list[str]
    supervisor_phone: str | None


def control_token(control: Control, recordings: Path) -> str:
    """The API token: from the environment variable named in the config, else a random one kept in
    `<recordings>/.control-token` (mode 600) so a console on this machine can read it."""
    token = os.environ.get(control.token_env, "").strip()
    if token:
        return token
    path = Path(recordings) / ".control-token"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    # written beside, then linked into place: workers starting together (serve --workers) share the
    # folder, and the first one's token must be everybody's, never half-written
    tmp = path.with_name(f".control-token.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        return path.read_text().strip()
    finally:
        tmp.unlink(missing_ok=True)
    log.warning("control_token_generated", path=str(path), env=control.token_env)
    return token


class _Client:
    def __init__(self, ws: web.WebSocketResponse):
        self.ws = ws
        self.queue: asyncio.Queue = asyncio.Queue(CLIENT_QUEUE)
        self.dropped = 0

    def send(self, message: dict) -> None:
        if self.queue.full():
            self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(message)


class ControlApi:
    def __init__(self, agent, control: Control, recordings: Path, token: str):
        self.agent = agent
        self.control = control
        self.recordings = Path(recordings)
        self._token = token
        self._clients: set[_Client] = set()
        self._runner: web.AppRunner | None = None
        self._table: asyncio.Task | None = None
        self._store_down = False  # what the consoles were last told about the store
        self.url = ""

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> str:
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 1024)
        app.router.add_get("/api/calls", self._calls)
        app.router.add_get("/api/calls/history", self._history)
        app.router.add_get(EVENTS_PATH, self._events)
        app.router.add_post("/api/calls/{call_id}/{action}", self._action)
        app.router.add_post("/api/dial", self._dial)
        app.router.add_get("/api/dial/{call_id}", self._dialled)
        app.router.add_get("/api/campaigns", self._campaigns)
        app.router.add_get("/api/dead-letters", self._dead_letters)
        app.router.add_get("/api/queues", self._queues)
        app.router.add_post("/api/agents/{name}/{action}", self._agent_action)
        app.router.add_get("/api/flows", self._flows)
        app.router.add_get("/api/recordings", self._recordings)
        app.router.add_get("/api/recordings/{day}/{name}", self._recording)
        app.router.add_get(METRICS_PATH, self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.control.host, self.control.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://{self.control.host}:{port}"
        self._table = asyncio.create_task(self._send_table())
        log.info("control_listening", url=self.url)
        if not _loopback(self.control.host):
            log.warning("control_not_loopback", url=self.url,
                        warning="the control API is served over plain HTTP on a non-loopback address: its "
                                "token and every call's events cross the network unencrypted. Put a TLS "
                                "reverse proxy in front and firewall this port.")
        return self.url

    async def stop(self) -> None:
        if self._table:
            self._table.cancel()
        for client in list(self._clients):
            await client.ws.close()
        if self._runner:
            await self._runner.cleanup()

    def attach(self, live) -> None:
        """Stream a new call's events to every connected console."""
        live.events.subscribe(lambda ev: self._broadcast({"type": "event", "event": json.loads(ev.to_json())}))

    def _broadcast(self, message: dict) -> None:
        for client in list(self._clients):
            client.send(message)

    def _store_event(self) -> dict:
        outbox = getattr(self.agent, "outbox", None)
        return {"kind": "store", "state": "unavailable" if self._store_down else "available",
                "waiting_writes": len(outbox) if outbox is not None else 0,
                "store": self.agent.config.store_url().display, "wall": round(time.time(), 3)}

    def _check_store(self) -> None:
        """Tell the consoles when the store stops taking this worker's writes, and when it takes
        them again (the writes wait meanwhile, and none is lost)."""
        outbox = getattr(self.agent, "outbox", None)
        down = bool(outbox is not None and outbox.warned)
        if down != self._store_down:
            self._store_down = down
            self._broadcast({"type": "event", "event": self._store_event()})

    async def _send_table(self) -> None:
        while True:
            await asyncio.sleep(TABLE_EVERY_S)
            self._check_store()
            if self._clients:
                self._broadcast({"type": "calls", "calls": self._table_rows()})
                if self.agent.queues is not None:
                    self._broadcast({"type": "queues", **self._queue_board()})

    # ------------------------------------------------------------ auth
    @web.middleware
    async def _auth(self, request: web.Request, handler):
        given = request.headers.get("Authorization", "")
        token = given[7:] if given.startswith("Bearer ") else ""
        if not token and request.path == EVENTS_PATH:  # only there: a query string ends up in logs
            token = request.query.get("token", "")
        if not token or not hmac.compare_digest(token.encode(), self._token.encode()):
            log.warning("control_unauthorized", path=request.path, remote=request.remote)
            return web.json_response({"error": "missing or wrong token"}, status=401)
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self.control.allowed_origins:
            # a web page's script (cross-site WebSocket hijacking); tools send no Origin
            log.warning("control_origin_refused", path=request.path, origin=origin[:100], remote=request.remote)
            return web.json_response({"error": f"Origin {origin[:100]!r} is not allowed"}, status=403)
        return await handler(request)

    # ------------------------------------------------------------ metrics
    async def _metrics(self, request: web.Request) -> web.Response:
        """Prometheus's scrape (bearer token like every other path: `authorization: credentials_file`
        in the scrape config)."""
        return web.Response(body=self.agent.metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    # ------------------------------------------------------------ calls
    def _table_rows(self) -> list[dict]:
        return [call_row(live) for live in list(self.agent.live.values())]

    # ------------------------------------------------------------ queues and agents
    def _queue_board(self) -> dict:
        queues, agents = self.agent.queues.snapshot()
        now = time.time()
        return {"queues": [q.as_dict() for q in queues],
                "agents": [{"name": a.name, "state": a.state.value, "reason": a.reason, "uri": a.uri,
                            "skills": list(a.skills), "in_state_s": round(now - a.since, 1), "call_id": a.call_id}
                           for a in agents]}

    async def _queues(self, request: web.Request) -> web.Response:
        if self.agent.queues is None:
            return web.json_response({"error": "no contact_center in this server's config"}, status=404)
        return web.json_response(self._queue_board())

    async def _agent_action(self, request: web.Request) -> web.Response:
        """`login`, `logout`, `pause {"reason"}`, `resume` for a human agent (the shared store:
        every worker sees it at once)."""
        from callcenter.store.queues import QueueStoreError

        if self.agent.queues is None:
            return web.json_response({"error": "no contact_center in this server's config"}, status=404)
        name, action = request.match_info["name"], request.match_info["action"]
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        reason = str(body.get("reason", ""))[:100]
        try:
            agent = self.agent.queues.set_agent_state(name, action, reason)
        except QueueStoreError as exc:
            status = 404 if "no agent" in str(exc) or "unknown agent action" in str(exc) else 409
            return web.json_response({"error": str(exc)}, status=status)
        log.info("agent_state", agent=name, state=agent.state.value, reason=agent.reason, action=action)
        self.agent_changed(name, action, "supervisor")
        return web.json_response({"ok": True, "agent": name, "state": agent.state.value})

    def agent_changed(self, name: str, action: str, by: str) -> None:
        """Tell every console an agent's state changed (`by`: supervisor, keypad)."""
        try:
            agent = self.agent.queues.agent(name)
        except Exception:
            return
        event = {"kind": "agent_state", "agent": name, "action": action, "state": agent.state.value,
                 "reason": agent.reason, "by": by}
        self.agent.center_event(**event)
        self._broadcast({"type": "event", "event": {**event, "wall": round(time.time(), 3)}})

    async def _calls(self, request: web.Request) -> web.Response:
        return web.json_response({"calls": self._table_rows()})

    async def _events(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=20)
        await ws.prepare(request)
        client = _Client(ws)
        history = {cid: [json.loads(e.to_json()) for e in live.events.history]
                   for cid, live in list(self.agent.live.items())}
        client.send({"type": "hello", "calls": self._table_rows(), "history": history})
        if self._store_down:
            client.send({"type": "event", "event": self._store_event()})
        self._clients.add(client)
        sender = asyncio.create_task(self._pump(client))
        try:
            async for msg in ws:  # the console only listens; anything it sends is ignored
                if msg.type == WSMsgType.ERROR:
                    break
        finally:
            self._clients.discard(client)
            sender.cancel()
        return ws

    async def _pump(self, client: _Client) -> None:
        reported = 0
        while not client.ws.closed:
            message = await client.queue.get()
            if client.dropped != reported:
                await client.ws.send_json({"type": "dropped", "messages": client.dropped - reported})
                reported = client.dropped
            await client.ws.send_json(message)

    async def _action(self, request: web.Request) -> web.Response:
        call_id, action = request.match_info["call_id"], request.match_info["action"]
        live = self.agent.live.get(call_id)
        if live is None or live.task is None:
            return web.json_response({"error": f"no live call {call_id!r}"}, status=404)
        if action not in ACTIONS:
            return web.json_response({"error": f"unknown action {action!r}; one of {', '.join(ACTIONS)}"}, status=404)
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        session = live.session
        if action == "say":
            text = str(body.get("text", "")).strip()
            if not text or len(text) > MAX_SAY_CHARS:
                return web.json_response({"error": f"say needs text of 1..{MAX_SAY_CHARS} characters"}, status=400)
            if body.get("take_over"):
                session.take_over()
            session.supervisor_say(text)
        elif action == "take_over":
            session.take_over()
        elif action in ("release", "resume"):
            session.release()
        elif action == "pause":
            session.pause()
        elif action == "transfer":
            problem = self._transfer(live, body)
            if problem:
                return web.json_response({"error": problem}, status=400)
        elif action == "hangup":
            session.supervisor_hangup()
        elif action == "mark":
            session.mark(str(body.get("note", ""))[:MAX_SAY_CHARS])
        elif action in ("listen", "whisper", "barge"):
            phone = str(body.get("phone") or self.control.supervisor_phone or "")
            if phone and not SIP_URI.match(phone):
                return web.json_response({"error": f"phone must be a SIP URI, got {phone!r}"}, status=400)
            try:
                await live.supervise(action, phone or None)
            except CallcenterError as exc:  # the transport could not reach the supervisor's phone
                return web.json_response({"error": str(exc)}, status=409)
        elif action == "leave":
            live.leave_supervision()
        log.info("control_action", call_id=call_id, action=action)
        return web.json_response({"ok": True, "call": call_row(live)})

    # ------------------------------------------------------------ flows and recordings
    def _transfer(self, live, body: dict) -> str | None:
        """`{"to": URI}` (blind), `{"queue": NAME}` (one of the call's flow's queues), or
        `{"agent": NAME}` (a human agent, warm); returns what is wrong, or None."""
        session = live.session
        if body.get("queue"):
            name = str(body["queue"])
            target = session.flow.queues.get(name)
            if target is None:
                return f"the flow has no queue {name!r}; it has {', '.join(session.flow.queues) or 'none'}"
            if isinstance(target, str):
                session.supervisor_transfer(target)
            else:
                session.supervisor_enqueue(name)
            return None
        if body.get("agent"):
            from callcenter.store.queues import QueueStoreError

            if self.agent.queues is None:
                return "no contact_center in this server's config: no agents to transfer to"
            try:
                person = self.agent.queues.agent(str(body["agent"]))
            except QueueStoreError as exc:
                return str(exc)
            session.supervisor_transfer_to_agent(person.name, person.uri)
            return None
        to = str(body.get("to", ""))
        if not SIP_URI.match(to):
            return f"transfer needs a SIP URI in to, a queue or an agent, got {to!r}"
        session.supervisor_transfer(to)
        return None

    async def _dial(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        to, flow = body.get("to"), body.get("flow")
        if not isinstance(to, str) or not to.strip() or not isinstance(flow, str) or not flow:
            return web.json_response({"error": "give to (a number or SIP URI) and flow (an outbound flow's name)"},
                                     status=400)
        try:
            live = await self.agent.dial(to, flow, body.get("variables") or {})
        except CallcenterError as exc:  # the transport's DialRefused, with its HTTP status
            log.warning("dial_refused", to=to, flow=flow, error=str(exc))
            return web.json_response({"error": str(exc)}, status=getattr(exc, "status", 400))
        log.info("dial_requested", to=to, flow=flow, call_id=live.call_id)
        return web.json_response(live.summary(), status=201)

    async def _dialled(self, request: web.Request) -> web.Response:
        live = self.agent.dialled.get(request.match_info["call_id"])
        if live is None:
            return web.json_response({"error": "no such dialled call (on this worker)"}, status=404)
        return web.json_response(live.summary())

    async def _dead_letters(self, request: web.Request) -> web.Response:
        from callcenter.store.dead_letters import DeadLetters

        return await self._from_store("dead_letters", DeadLetters(self.agent.store).recent)

    async def _campaigns(self, request: web.Request) -> web.Response:
        from callcenter.store.campaigns import CampaignStore

        return await self._from_store("campaigns", CampaignStore(self.agent.store).summaries)

    async def _from_store(self, key: str, read) -> web.Response:
        """`{key: read()}`, read off the event loop; 503 with why while the store does not answer."""
        from callcenter.store.db import StoreError

        try:
            found = await asyncio.get_running_loop().run_in_executor(None, read)
        except StoreError as exc:
            return web.json_response({"error": f"the store: {exc}"}, status=503)
        return web.json_response({key: found})

    async def _flows(self, request: web.Request) -> web.Response:
        lib = self.agent.flows
        flow = lib.current
        return web.json_response({"flows": [{"path": str(lib.path), "name": flow.name, "version": flow.version,
                                             "digest": lib.digest, "reloads": lib.reloads, "errors": lib.errors,
                                             "nodes": len(flow.nodes), "queues": list(flow.queues)}]})

    async def _history(self, request: web.Request) -> web.Response:
        from callcenter.store.db import StoreError
        from callcenter.store.period import PeriodError, period

        try:
            since, until = period(request.query.get("since", "today"), request.query.get("until"))
            limit = max(1, min(100_000, int(request.query.get("limit", "1000"))))
        except (PeriodError, ValueError) as exc:
            return web.json_response({"error": str(exc) or "limit must be a number"}, status=400)
        loop = asyncio.get_running_loop()
        try:  # off the loop: the store may be across the network
            calls = await loop.run_in_executor(None, self.agent.calls.between, since, until, limit)
        except StoreError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.json_response({"since": since, "until": until, "calls": calls})

    async def _recordings(self, request: web.Request) -> web.Response:
        try:
            limit = max(1, min(1000, int(request.query.get("limit", "100"))))
        except ValueError:
            return web.json_response({"error": "limit must be a number"}, status=400)
        files = [p for p in self.recordings.glob("*/*.jsonl") if not p.is_symlink() and not p.parent.is_symlink()]
        files = sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)[:limit]
        found = [recording_summary(p) for p in files]
        await asyncio.get_running_loop().run_in_executor(None, self._with_rows, found)
        return web.json_response({"recordings": found})

    def _with_rows(self, recordings: list[dict[str, Any]]) -> None:
        """Each recording's caller number, direction and outcome, from its call's row in the store
        (left out where the store does not answer: the list is still worth showing)."""
        from callcenter.store.calls import CallRecords
        from callcenter.store.db import StoreError

        calls = CallRecords(self.agent.store, "", "")
        for rec in recordings:
            try:
                row = calls.get(rec["call_id"]) or {}
            except StoreError:
                return
            rec.update(caller=row.get("caller_number") or row.get("caller") or "", outcome=row.get("outcome"),
                       direction=row.get("direction"), summary=row.get("summary"))

    async def _recording(self, request: web.Request) -> web.StreamResponse:
        day, name = request.match_info["day"], request.match_info["name"]
        if not _NAME.match(day) or not _NAME.match(name) or name.startswith(".") or day.startswith("."):
            return web.json_response({"error": "bad recording name"}, status=400)
        path = _plain_file(self.recordings, day, name if name.endswith(".wav") else f"{name}.jsonl")
        if path is None:
            return web.json_response({"error": "no such recording"}, status=404)
        if name.endswith(".wav"):
            return web.FileResponse(path)
        from callcenter.call.events import read_events

        return web.json_response({"summary": recording_summary(path), "events": read_events(path)})


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _clean(value: Any) -> Any:
    """Text from a client as it may be logged: lone surrogates (invalid in UTF-8) replaced."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


def _plain_file(root: Path, day: str, name: str) -> Path | None:
    """`root/day/name` if it is a plain file right there: not a link (nor in a linked folder), and
    never outside `root` (`..` in any spelling)."""
    import stat

    folder, path = root / day, root / day / name
    try:
        if stat.S_ISLNK(folder.lstat().st_mode) or not stat.S_ISREG(path.lstat().st_mode):
            return None
        if path.resolve().parent != root.resolve() / day:
            return None
    except OSError:
        return None
    return path


def call_row(live) -> dict[str, Any]:
    s = live.session
    caller_db, agent_db = live.bridge.levels
    return {
        "call_id": live.call_id,
        "caller": s.dialog.variables.get("caller", ""),
        "transport": live.transport,
        "flow": s.flow.name,
        "flow_version": s.flow.version,
        "node": s.dialog.node_name,
        "state": s.state if live.task is not None else "ringing",
        "started": live.started_wall,
        "duration_s": round(time.time() - live.started_wall, 1),
        "last_intent": s.dialog.variables.get("last_intent"),
        "turn": live.events.turn,
        "levels": {"caller_db": caller_db, "agent_db": agent_db},
        "marked": s.marked,
    }


def recording_summary(jsonl: Path) -> dict[str, Any]:
    from callcenter.call.events import read_events

    events = read_events(jsonl)
    first = events[0] if events else {}
    last = events[-1] if events else {}
    wav = jsonl.with_suffix(".wav")
    return {
        "day": jsonl.parent.name, "name": jsonl.stem, "call_id": first.get("call_id", jsonl.stem),
        "flow": first.get("flow"), "started": first.get("wall"),
        "duration_s": round(last.get("t", 0.0), 1), "ended_by": last.get("ended_by"),
        "complete": last.get("kind") == "call_end", "wav": wav.name if wav.exists() else None,
        "marked": next((e.get("note") for e in events if e.get("kind") == "marked"), None),
        "turns": last.get("turn", 0),
    }
