"""The console's campaigns panel (key C): every outbound campaign in the store, with what it has
dialled and how those calls ended, refreshed every few seconds from the control API."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from callcenter.supervisor.footer import FitFooter

REFRESH_S = 3.0
# (column, the summary's count) in the order a supervisor reads them
CAMPAIGN_COLUMNS = (("campaign", None), ("state", None), ("flow", None), ("contacts", "contacts"),
                    ("dialled", "dialled"), ("person", "answered"), ("machine", "machine"),
                    ("no answer", "no_answer"), ("busy", "busy"), ("failed", "failed"), ("DNC skip", "dnc_skipped"),
                    ("left", "remaining"))


class CampaignsUpdated(Message):
    """Every campaign's summary, from `GET /api/campaigns` (any worker: they share the store)."""

    def __init__(self, campaigns: list[dict], error: str | None = None):
        super().__init__()
        self.campaigns, self.error = campaigns, error


def campaign_cells(c: dict) -> tuple:
    counts = c.get("counts", {})
    return (c["name"], c["state"], c["flow"], *(str(counts.get(key, 0)) for _, key in CAMPAIGN_COLUMNS[3:]))


class CampaignsScreen(Screen):
    BINDINGS = [Binding("escape,b", "app.pop_screen", "Back"), Binding("r", "refresh", "Refresh")]
    DEFAULT_CSS = """
    #campaigns { height: 1fr; border: round $primary; }
    #campaigns-note { height: 1; padding: 0 1; }
    """

    def __init__(self, poll: bool = True):
        super().__init__()
        self.poll = poll  # False: the data comes as CampaignsUpdated messages only (tests)

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="campaigns", cursor_type="row", zebra_stripes=True)
        yield Static(id="campaigns-note")
        yield FitFooter()

    def on_mount(self) -> None:
        table = self.query_one("#campaigns", DataTable)
        table.border_title = "outbound campaigns"
        for name, _ in CAMPAIGN_COLUMNS:
            table.add_column(name, key=name)
        if self.poll:
            self.action_refresh()
            self.set_interval(REFRESH_S, self.action_refresh)

    @work(exclusive=True)
    async def action_refresh(self) -> None:
        error = None
        for server in self.app.servers:
            try:
                self.post_message(CampaignsUpdated((await server.get("/api/campaigns"))["campaigns"]))
                return
            except Exception as exc:  # this worker does not answer: ask the next
                error = f"{server.url}: {exc}"
        self.post_message(CampaignsUpdated([], error))

    def on_campaigns_updated(self, message: CampaignsUpdated) -> None:
        table = self.query_one("#campaigns", DataTable)
        table.clear()
        for c in message.campaigns:
            table.add_row(*campaign_cells(c), key=c["name"])
        note = self.query_one("#campaigns-note", Static)
        if message.error:
            note.update(f"cannot read the campaigns: {message.error}")
        elif not message.campaigns:
            note.update("no campaigns (callcenter campaign start FILE --config C)")
        else:
            note.update("pause or resume: callcenter campaign pause|resume NAME --config C")
