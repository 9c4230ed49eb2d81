"""The console's campaigns panel (key C): every outbound campaign in the store, with what it has
dialled and how those calls ended, refreshed every few seconds from the control API."""

from __future__ import annotations

from callcenter.supervisor.store_table import StoreTableScreen, TableRows

# (column, the summary's count) in the order a supervisor reads them
CAMPAIGN_COLUMNS = (("campaign", None), ("state", None), ("flow", None), ("contacts", "contacts"),
                    ("dialled", "dialled"), ("person", "answered"), ("machine", "machine"),
                    ("no answer", "no_answer"), ("busy", "busy"), ("failed", "failed"), ("DNC skip", "dnc_skipped"),
                    ("left", "remaining"))
CampaignsUpdated = TableRows  # every campaign's summary, from `GET /api/campaigns`


def campaign_cells(c: dict) -> tuple:
    counts = c.get("counts", {})
    return (c["name"], c["state"], c["flow"], *(str(counts.get(key, 0)) for _, key in CAMPAIGN_COLUMNS[3:]))


class CampaignsScreen(StoreTableScreen):
    PATH, KEY, TABLE_ID, TABLE_TITLE = "/api/campaigns", "campaigns", "campaigns", "outbound campaigns"
    COLUMNS = tuple(name for name, _ in CAMPAIGN_COLUMNS)
    DEFAULT_CSS = """
    #campaigns { height: 1fr; border: round $primary; }
    #campaigns-note { height: 1; padding: 0 1; }
    """

    def cells(self, item: dict) -> tuple:
        return campaign_cells(item)

    def row_key(self, i: int, item: dict) -> str:
        return item["name"]

    def note(self, items: list[dict], error: str | None) -> str:
        if error:
            return f"cannot read the campaigns: {error}"
        if not items:
            return "no campaigns (callcenter campaign start FILE --config C)"
        return "pause or resume: callcenter campaign pause|resume NAME --config C"
