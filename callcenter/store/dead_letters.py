"""End-of-call webhooks that never got through (`webhook_dead_letters`): the payload and the last
error are kept, so nothing is lost; the console lists them (`GET /api/dead-letters`)."""

from __future__ import annotations

import json
import time
from typing import Any

from callcenter.store.db import Database


class DeadLetters:
    """Webhooks that never got through, in the store (`webhook_dead_letters`)."""

    def __init__(self, db: Database, clock=time.time):
        self.db, self.clock = db, clock

    def add(self, call_id: str, url: str, attempts: int, error: str, payload: dict) -> None:
        with self.db.transaction():
            self.db.execute("INSERT INTO webhook_dead_letters(call_id, url, attempts, error, payload, failed) "
                            "VALUES(?, ?, ?, ?, ?, ?)", (call_id, url, attempts, error[:500], json.dumps(payload),
                                                         self.clock()))

    def recent(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT call_id, url, attempts, error, failed FROM webhook_dead_letters "
                               "ORDER BY failed DESC LIMIT ?", (limit,))
        return [dict(zip(("call_id", "url", "attempts", "error", "failed"), r)) for r in rows]
