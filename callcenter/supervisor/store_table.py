"""A console screen of one table the control API reads from the store (any worker will do: they
share it), refreshed every few seconds: the campaigns panel (C) and the dead letters (W)."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from callcenter.supervisor.footer import FitFooter


class TableRows(Message):
    """The items the screen's `PATH` answered (under `KEY`), or why there are none."""

    def __init__(self, items: list[dict], error: str | None = None):
        super().__init__()
        self.items, self.error = items, error


class StoreTableScreen(Screen):
    BINDINGS = [Binding("escape,b", "app.pop_screen", "Back"), Binding("r", "refresh", "Refresh")]
    PATH = KEY = TABLE_ID = TABLE_TITLE = ""  # the API path, its answer's list, the table's id and title
    COLUMNS: tuple[str, ...] = ()
    REFRESH_S = 3.0

    def __init__(self, poll: bool = True):
        super().__init__()
        self.poll = poll  # False: the rows come as TableRows messages only (tests)

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id=self.TABLE_ID, cursor_type="row", zebra_stripes=True)
        yield Static(id=f"{self.TABLE_ID}-note")
        yield FitFooter()

    def on_mount(self) -> None:
        table = self.query_one(f"#{self.TABLE_ID}", DataTable)
        table.border_title = self.TABLE_TITLE
        for name in self.COLUMNS:
            table.add_column(name, key=name)
        if self.poll:
            self.action_refresh()
            self.set_interval(self.REFRESH_S, self.action_refresh)

    @work(exclusive=True)
    async def action_refresh(self) -> None:
        error = None
        for server in self.app.servers:
            try:
                self.post_message(TableRows((await server.get(self.PATH))[self.KEY]))
                return
            except Exception as exc:  # this worker does not answer: ask the next
                error = f"{server.url}: {exc}"
        self.post_message(TableRows([], error))

    def on_table_rows(self, message: TableRows) -> None:
        table = self.query_one(f"#{self.TABLE_ID}", DataTable)
        table.clear()
        for i, item in enumerate(message.items):
            table.add_row(*self.cells(item), key=self.row_key(i, item))
        self.query_one(f"#{self.TABLE_ID}-note", Static).update(self.note(message.items, message.error))

    # ---- what a screen says of its own items
    def cells(self, item: dict) -> tuple:
        raise NotImplementedError

    def row_key(self, i: int, item: dict) -> str:
        return str(i)

    def note(self, items: list[dict], error: str | None) -> str:
        raise NotImplementedError
