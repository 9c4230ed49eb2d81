"""The end-of-call webhook: one signed POST per call, with the call's row, its summary and
categories, retried with backoff; a call whose webhook never got through lands in the store's dead
letters, with the payload, so nothing is lost.

The signature is HMAC-SHA256 of `<timestamp>.<body>` with the shared secret, in
`X-Callcenter-Signature: sha256=<hex>`, the timestamp in `X-Callcenter-Timestamp`. A receiver checks
both (and refuses an old timestamp), as for Stripe's or Slack's webhooks."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from typing import Any

import aiohttp
import structlog

from callcenter.store.dead_letters import DeadLetters

log = structlog.get_logger()

SIGNATURE_HEADER = "X-Callcenter-Signature"
TIMESTAMP_HEADER = "X-Callcenter-Timestamp"
TIMEOUT_S = 10.0


def signature(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


class Webhook:
    def __init__(self, url: str, secret: str, attempts: int, backoff_s: float, dead: DeadLetters):
        self.url, self.secret, self.attempts, self.backoff_s, self.dead = url, secret, attempts, backoff_s, dead

    async def send(self, payload: dict[str, Any]) -> bool:
        """POST it until a 2xx (True), or put it in the dead letters after the last attempt."""
        body = json.dumps(payload, default=str).encode()
        error = ""
        for attempt in range(1, self.attempts + 1):
            stamp = str(int(time.time()))
            headers = {"Content-Type": "application/json", TIMESTAMP_HEADER: stamp,
                       SIGNATURE_HEADER: signature(self.secret, stamp, body)}
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
                    async with http.post(self.url, data=body, headers=headers, allow_redirects=False) as r:
                        if 200 <= r.status < 300:
                            log.info("webhook_sent", call_id=payload.get("call_id"), attempt=attempt)
                            return True
                        error = f"HTTP {r.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                error = str(exc) or exc.__class__.__name__
            log.warning("webhook_failed", call_id=payload.get("call_id"), attempt=attempt, error=error)
            if attempt < self.attempts:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        await asyncio.get_running_loop().run_in_executor(
            None, self.dead.add, payload.get("call_id", ""), self.url, self.attempts, error, payload)
        log.error("webhook_dead_letter", call_id=payload.get("call_id"), attempts=self.attempts, error=error)
        return False
