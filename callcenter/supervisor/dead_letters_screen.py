"""The console's dead letters (key W): end-of-call webhooks that never got through, newest first,
from the store every worker shares (`GET /api/dead-letters`). Each keeps its payload in the store's
`webhook_dead_letters` table, so a receiver that was down can be sent them again."""

from __future__ import annotations

import datetime as dt

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from callcenter.supervisor.footer import FitFooter

REFRESH_S = 5.0
COLUMNS = ("failed", "call", "url", "tries", "last error")


class DeadLettersUpdated(Message):
    def __init__(self, letters: list[dict], error: str | None = None):
        super().__init__()
        self.letters, self.error = letters, error


def letter_cells(d: dict) -> tuple:
    when = dt.datetime.fromtimestamp(d["failed"]).strftime("%m-%d %H:%M:%S")
    return when, d["call_id"], d["url"], str(d["attempts"]), d["error"]


class DeadLettersScreen(Screen):
    BINDINGS = [Binding("escape,b", "app.pop_screen", "Back"), Binding("r", "refresh", "Refresh")]
    DEFAULT_CSS = """
    #dead-letters { height: 1fr; border: round $error; }
    #dead-letters-note { height: 1; padding: 0 1; }
    """

    def __init__(self, poll: bool = True):
        super().__init__()
        self.poll = poll  # False: the data comes as DeadLettersUpdated messages only (tests)

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="dead-letters", cursor_type="row", zebra_stripes=True)
        yield Static(id="dead-letters-note")
        yield FitFooter()

    def on_mount(self) -> None:
        table = self.query_one("#dead-letters", DataTable)
        table.border_title = "webhooks that never got through"
        for name in COLUMNS:
            table.add_column(name, key=name)
        if self.poll:
            self.action_refresh()
            self.set_interval(REFRESH_S, self.action_refresh)

    @work(exclusive=True)
    async def action_refresh(self) -> None:
        error = None
        for server in self.app.servers:
            try:
                self.post_message(DeadLettersUpdated((await server.get("/api/dead-letters"))["dead_letters"]))
                return
            except Exception as exc:  # this worker does not answer: ask the next
                error = f"{server.url}: {exc}"
        self.post_message(DeadLettersUpdated([], error))

    def on_dead_letters_updated(self, message: DeadLettersUpdated) -> None:
        table = self.query_one("#dead-letters", DataTable)
        table.clear()
        for i, d in enumerate(message.letters):
            table.add_row(*letter_cells(d), key=f"{d['call_id']}-{i}")
        note = self.query_one("#dead-letters-note", Static)
        if message.error:
            note.update(f"cannot read the dead letters: {message.error}")
        elif not message.letters:
            note.update("none: every end-of-call webhook got through")
        else:
            note.update(f"{len(message.letters)} not delivered; payloads are in the store (webhook_dead_letters)")
