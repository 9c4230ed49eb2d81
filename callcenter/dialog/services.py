"""Carries out what a flow asks of the outside world: webhook requests and model turns.

Shared by live calls and `callcenter test`, so a flow meets the same timeouts and fallbacks in both.
Failures never raise: a webhook that times out, refuses or returns something that is not JSON, and a
model that errors, stalls past the node's time budget or returns nothing, come back as a result the
engine turns into the node's fallback. Headers (which may carry tokens) are never logged.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import structlog

from callcenter.dialog.engine import Fetch, LlmReply, Think
from callcenter.dialog.flow import Flow
from callcenter.dialog.llm import LlmProvider, SentenceStream, make_provider

log = structlog.get_logger()

MAX_REPLY_BYTES = 1_000_000


@dataclass
class Fetched:
    status: int | None
    data: Any
    error: str | None
    seconds: float


@dataclass
class Thought:
    reply: LlmReply | None
    error: str | None
    seconds: float
    first_text_s: float | None


class FlowServices:
    def __init__(self, flow: Flow, providers: dict[str, LlmProvider] | None = None):
        self.flow = flow
        self.providers = providers if providers is not None else {}

    def provider(self, name: str) -> LlmProvider:
        if name not in self.providers:
            self.providers[name] = make_provider(self.flow.llm[name])
        return self.providers[name]

    async def fetch(self, action: Fetch, bound_log=log) -> Fetched:
        import aiohttp

        t0 = time.monotonic()
        try:
            timeout = aiohttp.ClientTimeout(total=action.timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                async with http.request(action.method, action.url, headers=action.headers,
                                        json=action.body) as response:
                    raw = await response.content.read(MAX_REPLY_BYTES)
                    status = response.status
            try:
                data = json.loads(raw.decode("utf-8")) if raw else None
                error = None
            except (ValueError, UnicodeDecodeError):
                data, error = None, f"HTTP {status} with a reply that is not JSON"
        except asyncio.TimeoutError:
            status, data, error = None, None, f"no reply within {action.timeout_s} s"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            status, data, error = None, None, f"{type(exc).__name__}: {exc}"
        seconds = time.monotonic() - t0
        if error:
            bound_log.warning("webhook_failed", node=action.node, url=action.url, error=error)
        return Fetched(status, data, error, seconds)

    async def think(self, action: Think, on_sentence: Callable[[str], Any], bound_log=log) -> Thought:
        """Run one model turn within the node's time budget; each finished sentence goes to
        `on_sentence` as soon as it is complete."""
        request = action.request
        t0 = time.monotonic()
        first: list[float] = []

        def sentence(s: str) -> None:
            if not first:
                first.append(time.monotonic() - t0)
            on_sentence(s)

        stream = SentenceStream(sentence)
        try:
            async with asyncio.timeout(request.time_budget_s):
                reply = await self.provider(request.provider).reply(request, stream.feed)
            stream.close()
            error = None
        except asyncio.TimeoutError:
            reply, error = None, f"no complete reply within {request.time_budget_s} s"
        except Exception as exc:  # a provider's bug or a server's garbage must not end the call
            reply, error = None, f"{type(exc).__name__}: {exc}"
        seconds = time.monotonic() - t0
        if error:
            bound_log.warning("llm_failed", node=request.node, provider=request.provider, error=error)
        return Thought(reply, error, seconds, first[0] if first else None)
