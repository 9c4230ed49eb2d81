"""`callcenter tui`: the supervisor's console (Textual).

One table of every live call on every connected agent server; the selected call's live transcript
and a latency waterfall of its turns (which stage made the caller wait); the floor's aggregates; and
actions on the selected call: say a sentence in the call's voice, take over / release, pause,
transfer, hang up, mark for review. Past calls, the served flows and the contact center's queues and
human agents (`Q`: log in, log out, pause with a reason, resume) are a key press away.

Server traffic arrives as Textual messages. Bursts collapse: a newer calls table replaces a queued
one from the same server, and a newer partial transcript replaces a queued partial of the same call
(`can_replace`), so 50 busy calls do not flood the UI.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Header, Input, Label, RichLog, Static

from callcenter.call.events import LLM_FELL_BACK
from callcenter.supervisor.floor import Floor, transcript_lines, waterfall
from callcenter.supervisor.footer import FitFooter

RECONNECT_S = 2.0
COLUMNS = ("caller", "flow / node", "state", "time", "intent", "in  out")
WHO_STYLE = {"caller": "bold cyan", "agent": "bold green", "keypad": "bold magenta", "flow": "dim",
             "supervisor": "bold yellow"}


class Server:
    """One agent server's control API."""

    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/")
        self.token = token

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def post(self, path: str, body: dict | None = None) -> dict:
        import aiohttp

        async with aiohttp.ClientSession(headers=self.headers, timeout=aiohttp.ClientTimeout(total=5)) as http:
            async with http.post(self.url + path, json=body or {}) as r:
                data = await r.json()
                if r.status != 200:
                    raise RuntimeError(data.get("error", f"HTTP {r.status}"))
                return data

    async def get(self, path: str) -> Any:
        import aiohttp

        async with aiohttp.ClientSession(headers=self.headers, timeout=aiohttp.ClientTimeout(total=5)) as http:
            async with http.get(self.url + path) as r:
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}")
                return await r.read() if path.endswith(".wav") else await r.json()


# ------------------------------------------------------------------ messages
class ServerState(Message):
    def __init__(self, server: str, state: str):
        super().__init__()
        self.server, self.state = server, state


class Hello(Message):
    def __init__(self, server: str, data: dict):
        super().__init__()
        self.server, self.data = server, data


class Recorded(Message):
    def __init__(self, server: str, recordings: list[dict]):
        super().__init__()
        self.server, self.recordings = server, recordings


class CallsUpdated(Message):
    def __init__(self, server: str, calls: list[dict]):
        super().__init__()
        self.server, self.calls = server, calls

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, CallsUpdated) and message.server == self.server


class QueuesUpdated(Message):
    """A server's queues and human agents (sent once a second): the newest replaces a queued one."""

    def __init__(self, server: str, board: dict):
        super().__init__()
        self.server, self.board = server, board

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, QueuesUpdated) and message.server == self.server


class EventArrived(Message):
    def __init__(self, server: str, event: dict):
        super().__init__()
        self.server, self.event = server, event

    def can_replace(self, message: Message) -> bool:  # only a partial transcript gives way to a newer one
        return (isinstance(message, EventArrived) and self.event.get("kind") == "stt_partial"
                and message.event.get("kind") == "stt_partial" and message.server == self.server
                and message.event.get("call_id") == self.event.get("call_id"))


# ------------------------------------------------------------------ widgets and screens
class Waterfall(Static):
    """The last answered turn, stage by stage, the slowest in red: which stage made the caller wait."""

    def show(self, turns: list[dict]) -> None:
        if not turns:
            self.update(Text("No answered turn yet.", style="dim"))
            return
        turn = turns[-1]
        stages = waterfall(turn)
        total = max(1e-3, sum(s for _, s, _ in stages))
        width = max(4, (self.size.width or 30) - 22)
        text = Text(f"turn {turn['turn']}: {turn['voice_to_voice'] * 1000:.0f} ms to reply\n", style="bold")
        for label, seconds, slowest in stages:
            bar = "█" * max(1 if seconds > 0 else 0, round(width * seconds / total))
            text.append(f"{label:<11}{seconds * 1000:6.0f} ms ", style="bold red" if slowest else "")
            text.append(bar + "\n", style="bold red" if slowest else "green")
        self.update(text)


class AskText(ModalScreen[str | None]):
    """A one-line prompt: the sentence to say, the URI to transfer to, a note."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, placeholder: str = ""):
        super().__init__()
        self.title_text, self.placeholder = title, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(id="ask"):
            yield Label(self.title_text)
            yield Input(placeholder=self.placeholder, id="ask-input")

    @on(Input.Submitted)
    def _done(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class Confirm(ModalScreen[bool]):
    """Yes or no before something that cannot be undone (hanging up on a caller, quitting)."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="ask"):
            yield Label(self.question)
            yield Label("y: yes   n or Esc: no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


KEYS_HELP = """Calls (the selected one)
  s  say a sentence to the caller          o  take over (the flow stops deciding)
  p  pause / resume the agent              r  release (the flow decides again)
  t  transfer (queue, agent or SIP URI)    m  mark for review, with a note
  h  hang up (asks first; the caller hears a goodbye)
  l  listen   w  whisper   b  barge in (your phone is called)   x  leave
Screens
  R  recordings (v: the voicemail inbox)    F  flows    Q  queues and agents    C  campaigns
  W  webhooks that never got through (dead letters)
  ?  this help
  ctrl+p  the command palette (every action by name)    q  quit (asks first)
Every screen: Esc or b goes back."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="ask"):
            yield Label("Keys", id="help-title")
            yield Static(KEYS_HELP, id="help-keys")


class PickTarget(ModalScreen[tuple[str, str] | None]):
    """Where to transfer the selected call: the flow's queues, the agents free now, or a typed URI.
    Returns (kind, value): ("queue", name), ("agent", name) or ("uri", "")."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, queues: list[str], agents: list[str]):
        super().__init__()
        self.choices = [("queue", q) for q in queues] + [("agent", a) for a in agents] + [("uri", "")]

    def compose(self) -> ComposeResult:
        from textual.widgets import OptionList

        with Vertical(id="ask"):
            yield Label("Transfer to:")
            yield OptionList(*[f"queue  {v}" if k == "queue" else f"agent  {v} (available)" if k == "agent"
                               else "a SIP URI…" for k, v in self.choices], id="targets")

    def on_option_list_option_selected(self, event) -> None:
        self.dismiss(self.choices[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)


class RecordingsScreen(Screen):
    """Past calls, newest first, with their caller and outcome; `v` keeps the voicemails only (the
    voicemail inbox)."""
    BINDINGS = [Binding("escape,b", "app.pop_screen", "Back"), Binding("p", "play", "Play WAV"),
                Binding("v", "voicemails", "Voicemails"), Binding("r", "refresh", "Refresh")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="recordings", cursor_type="row")
        yield RichLog(id="recording-transcript", wrap=True, markup=False, min_width=20)
        yield FitFooter()

    def on_mount(self) -> None:
        table = self.query_one("#recordings", DataTable)
        table.add_columns("started", "caller", "flow", "length", "outcome", "marked")
        table.border_title = "recordings"
        self.rows: dict[str, tuple] = {}
        self.found: list[tuple[str, Any, dict]] = []  # (key, server, recording) from every server
        self.voicemails_only = False
        self.action_refresh()

    @work(exclusive=True)
    async def action_refresh(self) -> None:
        found = []
        for server in self.app.servers:
            try:
                recs = (await server.get("/api/recordings?limit=200"))["recordings"]
            except Exception as exc:
                self.notify(f"{server.url}: {exc}", severity="error")
                continue
            found += [(f"{server.url}|{rec['day']}|{rec['name']}", server, rec) for rec in recs]
        self.show(found)

    def show(self, found: list[tuple[str, Any, dict]]) -> None:
        self.found = found
        table = self.query_one("#recordings", DataTable)
        table.clear()
        self.rows = {}
        for key, server, rec in found:
            if self.voicemails_only and rec.get("outcome") != "voicemail":
                continue
            self.rows[key] = (server, rec)
            started = dt.datetime.fromtimestamp(rec["started"]).strftime("%m-%d %H:%M:%S") if rec["started"] else "?"
            table.add_row(started, rec.get("caller") or "", rec.get("flow") or "", f"{rec['duration_s']:.0f} s",
                          rec.get("outcome") or rec.get("ended_by") or "—", rec.get("marked") or "", key=key)

    def action_voicemails(self) -> None:
        """The voicemail inbox: only the calls that left a message (again: every call)."""
        self.voicemails_only = not self.voicemails_only
        self.query_one("#recordings", DataTable).border_title = \
            "voicemail inbox" if self.voicemails_only else "recordings"
        self.show(self.found)

    @on(DataTable.RowHighlighted, "#recordings")
    async def _show(self, event: DataTable.RowHighlighted) -> None:
        server, rec = self.rows.get(event.row_key.value, (None, None))
        if server is None:
            return
        log = self.query_one("#recording-transcript", RichLog)
        log.clear()
        try:
            data = await server.get(f"/api/recordings/{rec['day']}/{rec['name']}")
        except Exception as exc:
            log.write(f"cannot load: {exc}")
            return
        write_transcript(log, transcript_lines(data["events"]))

    async def action_play(self) -> None:
        table = self.query_one("#recordings", DataTable)
        if table.cursor_row is None or not self.rows:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        server, rec = self.rows[key]
        player = shutil.which("play") or shutil.which("aplay")
        if not rec.get("wav"):
            self.notify("no WAV for this call", severity="warning")
            return
        data = await server.get(f"/api/recordings/{rec['day']}/{rec['wav']}")
        path = Path(tempfile.mkdtemp()) / rec["wav"]
        path.write_bytes(data)
        if not player:
            self.notify(f"no audio player here (sox play / aplay); the recording is saved at {path}",
                        severity="warning", timeout=30)
            return
        proc = await asyncio.create_subprocess_exec(player, "-q", str(path), stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode:  # a console machine without an audio device: the file is still the user's
            self.notify(f"cannot play here (no audio device?); the recording is saved at {path}: "
                        f"{err.decode(errors='replace')[-80:]}", severity="warning", timeout=30)


class FlowsScreen(Screen):
    BINDINGS = [Binding("escape,b", "app.pop_screen", "Back")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="flows", cursor_type="row")
        yield RichLog(id="flow-errors", wrap=True, markup=False)
        yield FitFooter()

    async def on_mount(self) -> None:
        table = self.query_one("#flows", DataTable)
        table.add_columns("server", "flow", "version", "digest", "reloads", "status")
        log = self.query_one("#flow-errors", RichLog)
        for server in self.app.servers:
            try:
                flows = (await server.get("/api/flows"))["flows"]
            except Exception as exc:
                table.add_row(server.url, "?", "", "", "", f"unreachable: {exc}")
                continue
            for f in flows:
                status = "ok" if not f["errors"] else f"edit rejected: {len(f['errors'])} problems"
                table.add_row(server.url, f["name"], str(f["version"]), f["digest"], str(f["reloads"]), status)
                for problem in f["errors"]:
                    log.write(problem)


QUEUE_COLUMNS = ("queue", "waiting", "callbacks", "longest", "avail", "busy", "paused", "SL", "answered",
                 "abandoned")
AGENT_COLUMNS = ("agent", "state", "for", "reason / call")
AGENT_STYLE = {"available": "green", "ringing": "bold magenta", "on_call": "bold cyan", "wrap_up": "cyan",
               "paused": "yellow", "logged_out": "dim"}


def _mmss(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def queue_cells(q: dict) -> list:
    sl = q.get("service_level")
    sl_text = Text("—" if sl is None else f"{sl * 100:.0f}%", style="" if sl is None or sl >= 0.8 else "bold red")
    longest = Text(_mmss(q.get("longest_wait_s", 0)),
                   style="bold red" if q.get("waiting") and q.get("longest_wait_s", 0) > q.get("service_level_s", 20)
                   else "")
    return [q["name"], str(q.get("waiting", 0)), str(q.get("callbacks_pending", 0)), longest, str(q.get("available", 0)), str(q.get("busy", 0)),
            str(q.get("paused", 0)), sl_text, str(q.get("answered_today", 0)),
            str(q.get("abandoned_today", 0) + q.get("timed_out_today", 0))]


def agent_cells(a: dict) -> list:
    state = a.get("state", "")
    detail = a.get("reason") or (a.get("call_id") or "")
    return [a["name"], Text(state.replace("_", " "), style=AGENT_STYLE.get(state, "")), _mmss(a.get("in_state_s", 0)),
            detail]


def queue_alerts(board: dict) -> list[str]:
    """Callers waiting past their queue's service level."""
    return [f"{q['name']}: {q['waiting']} waiting, longest {_mmss(q['longest_wait_s'])} (SL {q['service_level_s']:.0f} s)"
            for q in board.get("queues", []) if q.get("waiting") and q.get("longest_wait_s", 0) > q.get("service_level_s", 20)]


class QueuesScreen(Screen):
    """The contact center: every queue's figures and every human agent's state, with the agent
    actions (log in, log out, pause with a reason, resume)."""
    BINDINGS = [Binding("escape,b", "app.pop_screen", "Back"), Binding("i", "agent('login')", "Log in"),
                Binding("o", "agent('logout')", "Log out"), Binding("p", "pause", "Pause"),
                Binding("u", "agent('resume')", "Resume")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="queues", cursor_type="none", zebra_stripes=True)
        yield DataTable(id="agents", cursor_type="row", zebra_stripes=True)
        yield Static(id="queue-alerts")
        yield FitFooter()

    def on_mount(self) -> None:
        self.query_one("#queues", DataTable).border_title = "queues"
        self.query_one("#agents", DataTable).border_title = "agents"
        for table_id, columns in (("#queues", QUEUE_COLUMNS), ("#agents", AGENT_COLUMNS)):
            table = self.query_one(table_id, DataTable)
            for name in columns:
                table.add_column(name, key=name)
        self.query_one("#queues", DataTable).can_focus = False
        self.query_one("#agents", DataTable).focus()
        self.draw()

    def draw(self) -> None:
        board = self.app.floor_queues
        for table_id, rows, cells, key in (("#queues", board.get("queues", []), queue_cells, "name"),
                                           ("#agents", board.get("agents", []), agent_cells, "name")):
            table = self.query_one(table_id, DataTable)
            keys = {r[key] for r in rows}
            for row_key in list(table.rows):
                if row_key.value not in keys:
                    table.remove_row(row_key)
            columns = QUEUE_COLUMNS if table_id == "#queues" else AGENT_COLUMNS
            for r in rows:
                values = cells(r)
                if r[key] in table.rows:
                    for name, value in zip(columns, values):
                        table.update_cell(r[key], name, value)
                else:
                    table.add_row(*values, key=r[key])
        alerts = queue_alerts(board)
        self.query_one("#queue-alerts", Static).update(
            Text("  ".join(alerts), style="bold red") if alerts else Text("no alerts", style="dim"))

    def _agent(self) -> str | None:
        table = self.query_one("#agents", DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    async def action_agent(self, action: str, reason: str = "") -> None:
        name = self._agent()
        server = self.app.queue_server
        if name is None or server is None:
            self.notify("no agent selected", severity="warning")
            return
        try:
            await server.post(f"/api/agents/{name}/{action}", {"reason": reason} if reason else {})
            self.notify(f"{name}: {action}")
        except Exception as exc:
            self.notify(f"{name}: {exc}", severity="error")

    def action_pause(self) -> None:
        def then(reason: str | None) -> None:
            if reason is not None:
                self.run_worker(self.action_agent("pause", reason or "break"))
        self.app.push_screen(AskText("Pause: reason", "break, lunch, training…"), then)


class SupervisorApp(App):
    TITLE = "callcenter supervisor"
    CSS = """
    #calls { height: 1fr; min-height: 5; }
    #detail { height: 2fr; }
    #transcript { width: 3fr; border: round $primary; }
    #waterfall { width: 2fr; border: round $secondary; padding: 0 1; }
    #stats { height: 1; background: $boost; padding: 0 1; }
    #alerts { height: auto; max-height: 3; padding: 0 1; color: $error; text-style: bold; }
    AskText { align: center middle; }
    #ask { width: 70; height: auto; border: thick $primary; background: $surface; padding: 1 2; }
    #recordings { height: 1fr; }
    #recording-transcript { height: 1fr; border: round $primary; }
    #queues { height: auto; max-height: 45%; border: round $primary; }
    #agents { height: 1fr; border: round $secondary; }
    #queue-alerts { height: 1; padding: 0 1; }
    """
    BINDINGS = [
        Binding("s", "say", "Say"),
        Binding("o", "take_over", "Take over"),
        Binding("r", "release", "Release"),
        Binding("p", "pause", "Pause"),
        Binding("t", "transfer", "Transfer"),
        Binding("h", "hangup", "Hang up"),
        Binding("m", "mark", "Mark"),
        Binding("l", "listen", "Listen"),
        Binding("w", "whisper", "Whisper"),
        Binding("b", "barge", "Barge"),
        Binding("x", "leave", "Leave", show=False),
        Binding("R", "recordings", "Recordings"),
        Binding("F", "flows", "Flows"),
        Binding("Q", "queues", "Queues"),
        Binding("C", "campaigns", "Campaigns"),
        Binding("W", "dead_letters", "Webhooks", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "ask_quit", "Quit"),
    ]

    def __init__(self, servers: list[Server], connect: bool = True, today: dt.date | None = None):
        super().__init__()
        self.servers = servers
        self.by_url = {s.url: s for s in servers}
        self.floor = Floor(today)
        self.selected: str | None = None
        self._connect = connect
        self.floor_queues: dict = {}  # the contact center's queues and agents (the latest board)
        self.queue_server: Server | None = None  # where agent actions go (every worker shares the store)
        self.phone: str | None = os.environ.get("CALLCENTER_SUPERVISOR_PHONE")  # joined for listen/whisper/barge
        self.clock = time.time  # wall clock of the alerts (tests fix it)

    # ---- layout
    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="calls", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="detail"):
            yield RichLog(id="transcript", wrap=True, markup=False, min_width=20)
            yield Waterfall(id="waterfall")
        yield Static(id="alerts")
        yield Static(id="stats")
        yield FitFooter()

    def on_mount(self) -> None:
        table = self.query_one("#calls", DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)
        self.query_one("#transcript", RichLog).border_title = "transcript"
        self.query_one("#waterfall", Waterfall).border_title = "latency of the last turn"
        self._draw_stats()
        if self._connect:
            for server in self.servers:
                self.run_worker(self._follow(server), exclusive=False, group="servers")

    # ---- server connections
    async def _follow(self, server: Server) -> None:
        import aiohttp

        while True:
            try:
                async with aiohttp.ClientSession(headers=server.headers) as http:
                    async with http.ws_connect(server.url + "/api/events", heartbeat=20) as ws:
                        self.post_message(ServerState(server.url, "connected"))
                        async for msg in ws:
                            if msg.type != aiohttp.WSMsgType.TEXT:
                                break
                            data = msg.json()
                            kind = data.get("type")
                            if kind == "event":
                                self.post_message(EventArrived(server.url, data["event"]))
                            elif kind == "calls":
                                self.post_message(CallsUpdated(server.url, data["calls"]))
                            elif kind == "queues":
                                self.post_message(QueuesUpdated(server.url, data))
                            elif kind == "hello":
                                self.post_message(Hello(server.url, data))
                                self.run_worker(self._recorded(server))
                            elif kind == "dropped":
                                self.floor.dropped += data.get("messages", 0)
                self.post_message(ServerState(server.url, "disconnected"))
            except Exception as exc:
                reason = "wrong token" if "401" in str(exc) else str(exc) or type(exc).__name__
                self.post_message(ServerState(server.url, f"disconnected: {reason}"))
            await asyncio.sleep(RECONNECT_S)

    async def _recorded(self, server: Server) -> None:
        try:
            recs = (await server.get("/api/recordings?limit=1000"))["recordings"]
        except Exception:
            return  # the count stays what this console saw
        self.post_message(Recorded(server.url, recs))

    def on_recorded(self, message: Recorded) -> None:
        self.floor.recorded(message.server, message.recordings)
        self._draw_stats()

    def on_server_state(self, message: ServerState) -> None:
        self.floor.servers[message.server] = message.state
        self._draw_stats()

    def on_hello(self, message: Hello) -> None:
        self.floor.hello(message.server, message.data)
        self._draw_table()
        self._draw_detail()

    def on_calls_updated(self, message: CallsUpdated) -> None:
        self.floor.table(message.server, message.calls)
        self._draw_table()
        self._draw_stats()

    def on_queues_updated(self, message: QueuesUpdated) -> None:
        self.floor_queues = {"queues": message.board.get("queues", []), "agents": message.board.get("agents", [])}
        self.queue_server = self.by_url.get(message.server, self.queue_server)
        if isinstance(self.screen, QueuesScreen):
            self.screen.draw()
        self._draw_stats()

    def on_event_arrived(self, message: EventArrived) -> None:
        if "call_id" not in message.event:  # the contact center's own events: an agent's state
            e = message.event
            if e.get("kind") == "store":
                if e.get("state") == "unavailable":
                    self.notify(f"{message.server}: the store {e.get('store', '')} does not answer; "
                                f"{e.get('waiting_writes', 0)} writes wait for it (calls go on)",
                                severity="warning", timeout=30)
                else:
                    self.notify(f"{message.server}: the store answers again; nothing was lost")
            elif e.get("kind") == "agent_state":
                self.notify(f"{e.get('agent')}: {str(e.get('state', '')).replace('_', ' ')}"
                            f"{' (' + e['reason'] + ')' if e.get('reason') else ''} — by {e.get('by', '?')}")
            return
        view = self.floor.event(message.server, message.event)
        if view.key == self.selected:
            self._append(message.event)
        if message.event.get("kind") in ("call_start", "call_end", "first_rtp_out"):
            self._draw_stats()

    # ---- drawing
    def _draw_table(self) -> None:
        table = self.query_one("#calls", DataTable)
        live = self.floor.shown(self.clock())
        keys = {v.key for v in live}
        for row_key in list(table.rows):
            if row_key.value not in keys:
                table.remove_row(row_key)
        for view in live:
            cells = self._cells(view)
            if view.key in table.rows:
                for name, value in zip(COLUMNS, cells):
                    table.update_cell(view.key, name, value, update_width=True)
            else:
                table.add_row(*cells, key=view.key)
        if self.selected not in keys and live:
            self._select(live[0].key)
        elif not live and self.selected is not None:
            self.selected = None
            self._draw_detail()

    def _widths(self) -> tuple[int, int, int, int]:
        """(caller, flow / node, state, intent) widths: the narrow console keeps the table on one
        screen; from 120 columns nothing a supervisor reads is cut."""
        width = self.size.width
        if width >= 140:
            return 26, 34, 14, 22
        if width >= 120:
            return 22, 28, 14, 16
        return 15, 18, 12, 8

    def _cells(self, view) -> list:
        w_caller, w_flow, w_state, w_intent = self._widths()
        row = view.row
        levels = row.get("levels", {})
        state = row.get("state", "")
        style = {"taken over": "bold yellow", "paused": "yellow", "talking": "green", "transferring": "magenta",
                 "bridged": "magenta", "ended": "dim"}.get(state, "")
        if view.ended:
            state = "ended"
        seconds = int(row.get("duration_s", 0))
        marked = " ✎" if row.get("marked") else ""
        return [
            Text(caller_label(row)[:w_caller]),
            Text(f"{row.get('flow', '')}/{row.get('node', '')}"[:w_flow]),
            Text((state + marked)[:w_state], style=style),
            f"{seconds // 60}:{seconds % 60:02d}",
            str(row.get("last_intent") or "—")[:w_intent],
            Text.assemble(_meter(levels.get("caller_db", -96)), " ", _meter(levels.get("agent_db", -96))),
        ]

    def _draw_stats(self) -> None:
        a = self.floor.aggregates()
        v2v = (f"{a['v2v_p50'] * 1000:.0f}/{a['v2v_p95'] * 1000:.0f} ms" if a["v2v_p50"] is not None else "—")
        down = [u for u, s in self.floor.servers.items() if s != "connected"]
        servers = f"{len(self.floor.servers) - len(down)}/{len(self.servers)} servers"
        text = Text(f"now {a['now']}  today {a['today']}  v2v p50/p95 {v2v}  transfers {a['transfers']}  "
                    f"abandoned {a['abandoned']}  {servers}")
        paths = self.floor.model_paths
        if paths:
            fell_back = sum(n for p, n in paths.items() if p in LLM_FELL_BACK)
            text.append(f"  model {paths.get('model', 0)}/{sum(paths.values())} turns, fell back {fell_back}"
                        f" (busy {paths.get('busy', 0)})", style="yellow" if paths.get("busy") else "")
        if self.floor_queues.get("queues"):
            waiting = sum(q.get("waiting", 0) for q in self.floor_queues["queues"])
            free = sum(a.get("state") == "available" for a in self.floor_queues.get("agents", []))
            text.append(f"  queued {waiting}  agents free {free}",
                        style="bold red" if queue_alerts(self.floor_queues) else "")
        if down:
            text.append(f"  {down[0]}: {self.floor.servers[down[0]]}", style="bold red")
        self.query_one("#stats", Static).update(text)
        alerts = [why for _, why in self.floor.alerts(self.clock())] + queue_alerts(self.floor_queues)
        self.query_one("#alerts", Static).update("  ".join(f"⚠ {a}" for a in alerts))
        self.query_one("#alerts", Static).display = bool(alerts)

    def _select(self, key: str | None) -> None:
        self.selected = key
        self._draw_detail()

    def _draw_detail(self) -> None:
        log = self.query_one("#transcript", RichLog)
        log.clear()
        view = self.floor.find(self.selected)
        if view is None:
            log.write(Text("No call selected.", style="dim"))
            self.query_one("#waterfall", Waterfall).show([])
            return
        log.border_title = f"transcript {view.row.get('caller', view.call_id)}"
        write_transcript(log, view.transcript())
        self.query_one("#waterfall", Waterfall).show(view.turns())

    def _append(self, event: dict) -> None:
        log = self.query_one("#transcript", RichLog)
        write_transcript(log, transcript_lines([event]))
        if event.get("kind") == "stt_partial":
            log.border_subtitle = f"hearing: {event.get('text', '')[-50:]}"
        elif event.get("kind") in ("stt_final", "speech_start"):
            log.border_subtitle = ""
        if event.get("kind") == "first_rtp_out":
            view = self.floor.find(self.selected)
            if view is not None:
                self.query_one("#waterfall", Waterfall).show(view.turns())

    @on(DataTable.RowHighlighted, "#calls")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value != self.selected:
            self._select(event.row_key.value)

    # ---- actions on the selected call
    def _target(self):
        view = self.floor.find(self.selected)
        if view is None:
            self.notify("no call selected", severity="warning")
            return None, None
        if view.ended:
            self.notify("that call has ended", severity="warning")
            return None, None
        return self.by_url.get(view.server), view

    async def _act(self, action: str, body: dict | None = None) -> None:
        server, view = self._target()
        if server is None:
            return
        try:
            data = await server.post(f"/api/calls/{view.call_id}/{action}", body)
        except Exception as exc:
            self.notify(f"{action}: {exc}", severity="error")
            return
        view.row.update(data.get("call", {}))
        self._draw_table()

    def _ask(self, title: str, placeholder: str, then) -> None:
        if self._target()[0] is None:
            return
        self.push_screen(AskText(title, placeholder), then)

    def action_say(self) -> None:
        self._ask("Say to the caller (the flow goes on afterwards):", "a sentence",
                  lambda text: text and self.run_worker(self._act("say", {"text": text})))

    def action_take_over(self) -> None:
        self._ask("Take over: say to the caller (the flow waits until you release):", "a sentence",
                  lambda text: text and self.run_worker(self._act("say", {"text": text, "take_over": True})))

    async def action_release(self) -> None:
        await self._act("release")

    async def action_pause(self) -> None:
        """`p` pauses the selected call, and resumes it when it is paused."""
        server, view = self._target()
        if server is None:
            return
        paused = view.row.get("state") == "paused"
        await self._act("resume" if paused else "pause")
        self.notify("resumed" if paused else "paused: p again resumes")

    async def action_transfer(self) -> None:
        """Offer the call's flow's queues and the agents free now; a URI can still be typed."""
        server, view = self._target()
        if server is None:
            return
        try:
            flows = (await server.get("/api/flows"))["flows"]
            queues = [q for f in flows if f.get("name") == view.row.get("flow") for q in f.get("queues", [])]
        except Exception:
            queues = []
        agents = [a["name"] for a in self.floor_queues.get("agents", []) if a.get("state") == "available"]

        def picked(choice) -> None:
            if choice is None:
                return
            kind, value = choice
            if kind == "uri":
                self._ask("Transfer to (SIP URI):", "sip:desk@pbx.example",
                          lambda uri: uri and self.run_worker(self._act("transfer", {"to": uri})))
            else:
                self.run_worker(self._act("transfer", {kind: value}))
        self.push_screen(PickTarget(queues, agents), picked)

    async def _supervise(self, mode: str) -> None:
        """Join the supervisor's own phone to the call, or switch its mode. The phone is asked for
        once (unless the server's config names one) and remembered."""
        server, view = self._target()
        if server is None:
            return
        body = {"phone": self.phone} if self.phone else {}
        try:
            await server.post(f"/api/calls/{view.call_id}/{mode}", body)
            self.notify(f"{mode}: your phone is on the call" if mode != "leave" else "left the call")
        except Exception as exc:
            if "which phone" in str(exc):
                def then(phone: str | None) -> None:
                    if phone:
                        self.phone = phone
                        self.run_worker(self._supervise(mode))
                self.push_screen(AskText("Your phone (SIP URI), called to join the call:", "sip:me@10.0.0.7"),
                                 then)
            else:
                self.notify(f"{mode}: {exc}", severity="error")

    async def action_listen(self) -> None:
        await self._supervise("listen")

    async def action_whisper(self) -> None:
        await self._supervise("whisper")

    async def action_barge(self) -> None:
        await self._supervise("barge")

    async def action_leave(self) -> None:
        await self._supervise("leave")

    def action_hangup(self) -> None:
        """Hang up on the selected caller, once the supervisor says yes: they hear a goodbye first."""
        server, view = self._target()
        if server is None:
            return
        caller = view.row.get("caller") or view.call_id

        def then(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._act("hangup"))
            else:
                self.notify("not hung up")
        self.push_screen(Confirm(f"Hang up on {caller}? They hear a goodbye first."), then)

    def action_ask_quit(self) -> None:
        live = sum(1 for v in self.floor.calls.values() if not v.ended) if hasattr(self, "floor") else 0
        self.push_screen(Confirm(f"Quit the console? ({live} live calls go on without you.)"),
                         lambda yes: self.exit() if yes else None)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_mark(self) -> None:
        def then(note: str | None) -> None:
            if note is None:  # Esc: not marked
                return
            self.run_worker(self._act("mark", {"note": note}))
            self.notify(f"marked for review: {note}")
        self._ask("Mark for review (note):", "why", then)

    def action_recordings(self) -> None:
        self.push_screen(RecordingsScreen())

    def action_queues(self) -> None:
        self.push_screen(QueuesScreen())

    def action_flows(self) -> None:
        self.push_screen(FlowsScreen())

    def action_dead_letters(self) -> None:
        from callcenter.supervisor.dead_letters_screen import DeadLettersScreen

        self.push_screen(DeadLettersScreen(poll=self._connect))

    def action_campaigns(self) -> None:
        from callcenter.supervisor.campaigns_screen import CampaignsScreen

        self.push_screen(CampaignsScreen(poll=self._connect))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for title, help_text, action in (
            ("Say to the caller", "The agent speaks a sentence in the call's voice", self.action_say),
            ("Take over the call", "Speak for the agent; the flow waits until released", self.action_take_over),
            ("Release the call", "Give the call back to the flow", self.action_release),
            ("Pause the agent", "Hold the agent's voice and the flow", self.action_pause),
            ("Transfer the call", "Blind transfer to a SIP URI", self.action_transfer),
            ("Hang up the call", "End the selected call", self.action_hangup),
            ("Mark the call for review", "Note on the recording", self.action_mark),
            ("Recordings", "Past calls, transcripts, audio", self.action_recordings),
            ("Flows", "Loaded flows, versions, rejected edits", self.action_flows),
            ("Campaigns", "Outbound campaigns: dialled, answered, no answer, remaining", self.action_campaigns),
            ("Webhooks", "End-of-call webhooks that never got through (dead letters)", self.action_dead_letters),
        ):
            yield SystemCommand(title, help_text, action)


def write_transcript(log: RichLog, lines: list[tuple[str, str]]) -> None:
    for who, text in lines:
        log.write(Text.assemble((f"{who:>10} ", WHO_STYLE.get(who, "")), text))


def caller_label(row: dict) -> str:
    """sip:4155550100@pbx → 4155550100; a browser caller (webrtc:203.0.113.5) → web 203.0.113.5."""
    caller = str(row.get("caller", ""))
    if row.get("transport") == "webrtc" or caller.startswith("webrtc:"):
        return "web " + caller.removeprefix("webrtc:")
    return caller.removeprefix("sip:").split("@")[0]


def _meter(db: float) -> Text:
    """A 4-cell level meter for -60..0 dBFS."""
    filled = max(0, min(4, round((db + 60) / 15)))
    return Text("▮" * filled + "▯" * (4 - filled), style="green" if filled < 4 else "red")


def run_tui(urls: list[str], token_file: str | Path | None, recordings: Path = Path("recordings")) -> int:
    """`token_file`, else $CALLCENTER_TOKEN, else the server's recordings/.control-token: the token
    is never an argument, which every user of the machine could read in `ps`."""
    from callcenter.supervisor.client import read_token

    token = read_token(token_file, recordings)
    SupervisorApp([Server(u, token) for u in urls]).run()
    return 0
