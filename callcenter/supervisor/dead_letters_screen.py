"""The console's dead letters (key W): end-of-call webhooks that never got through, newest first,
from the store every worker shares (`GET /api/dead-letters`). Each keeps its payload in the store's
`webhook_dead_letters` table, so a receiver that was down can be sent them again."""

from __future__ import annotations

import datetime as dt

from callcenter.supervisor.store_table import StoreTableScreen, TableRows

DeadLettersUpdated = TableRows  # from `GET /api/dead-letters`


def letter_cells(d: dict) -> tuple:
    when = dt.datetime.fromtimestamp(d["failed"]).strftime("%m-%d %H:%M:%S")
    return when, d["call_id"], d["url"], str(d["attempts"]), d["error"]


class DeadLettersScreen(StoreTableScreen):
    PATH, KEY, TABLE_ID, TABLE_TITLE = "/api/dead-letters", "dead_letters", "dead-letters", "webhooks that never got through"
    COLUMNS = ("failed", "call", "url", "tries", "last error")
    REFRESH_S = 5.0
    DEFAULT_CSS = """
    #dead-letters { height: 1fr; border: round $error; }
    #dead-letters-note { height: 1; padding: 0 1; }
    """

    def cells(self, item: dict) -> tuple:
        return letter_cells(item)

    def row_key(self, i: int, item: dict) -> str:
        return f"{item['call_id']}-{i}"

    def note(self, items: list[dict], error: str | None) -> str:
        if error:
            return f"cannot read the dead letters: {error}"
        if not items:
            return "none: every end-of-call webhook got through"
        return f"{len(items)} not delivered; payloads are in the store (webhook_dead_letters)"
