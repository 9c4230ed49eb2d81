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
from callcenter.errors import CallcenterError

log = structlog.get_logger()

MAX_REPLY_BYTES = 1_000_000
MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)


class WebhookRefused(CallcenterError):
    """A reply the agent will not take: a redirect to another host, an oversized body."""


async def _read_limited(content, limit: int) -> bytes:
    """The whole body, however many chunks it comes in; WebhookRefused past `limit` bytes."""
    chunks, size = [], 0
    while True:
        chunk = await content.read(limit + 1 - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise WebhookRefused(f"reply larger than {limit} bytes")


@dataclass
class Fetched:
    status: int | None
    data: Any
    error: str | None
    seconds: float


def local_provider(path: str) -> LlmProvider:
    """`kind: local` pinned to one path; ModelNotBuilt where the path needs the offline model."""
    from callcenter.dialog.llm import LocalTriage
    from callcenter.dialog.llm_model import installed
    from callcenter.dialog.local_llm import HybridTriage, LocalLlm

    if path == "embedding":
        return LocalTriage()
    if not installed():
        raise ModelNotBuilt(f"the scenario pins llm: {path}, which needs the offline model "
                            "(./scripts/setup --llm builds it)")
    return HybridTriage() if path == "hybrid" else LocalLlm()


class ModelNotBuilt(RuntimeError):
    pass


@dataclass
class Thought:
    reply: LlmReply | None
    error: str | None
    seconds: float
    first_text_s: float | None


LOCAL_PATHS = ("embedding", "hybrid", "model")  # what `kind: local` may be pinned to (flow scenarios)


class FlowServices:
    def __init__(self, flow: Flow, providers: dict[str, LlmProvider] | None = None, local_path: str | None = None):
        """`local_path`: pin what `kind: local` runs (embedding: the example phrases alone; hybrid:
        the offline model behind them; model: the model alone), whatever this machine has built;
        None: as the machine has it (a server)."""
        self.flow = flow
        self.providers = providers if providers is not None else {}
        self.local_path = local_path

    def provider(self, name: str) -> LlmProvider:
        if name not in self.providers:
            config = self.flow.llm[name]
            if config.kind == "local" and self.local_path is not None:
                self.providers[name] = local_provider(self.local_path)
            else:
                self.providers[name] = make_provider(config)
        return self.providers[name]

    def end_of_turn(self, name: str) -> Callable[[str], bool] | None:
        """The provider's judge of whether a caller's words read as a finished sentence, if it has one
        (the offline model's `EndOfTurn`); None when the provider cannot judge or is not set up."""
        try:
            return getattr(self.provider(name), "end_of_turn", None)
        except Exception as exc:  # a provider that cannot be made fails at its first turn, loudly there
            log.debug("end_of_turn_unavailable", provider=name, error=str(exc))
            return None

    async def fetch(self, action: Fetch, bound_log=log, scrub: Callable[[Any], Any] = lambda x: x) -> Fetched:
        """Make the webhook's request. Redirects are followed only within the same origin (scheme,
        host, port): the flow's secret headers never travel to a host the flow did not name. `scrub`
        takes the call's secrets out of what is logged."""
        import aiohttp
        import yarl

        t0 = time.monotonic()
        try:
            timeout = aiohttp.ClientTimeout(total=action.timeout_s)
            url = yarl.URL(action.url, encoded=True)  # already encoded: a caller's %2E%2E stays as it is
            async with aiohttp.ClientSession(timeout=timeout) as http:
                for _ in range(MAX_REDIRECTS + 1):
                    async with http.request(action.method, url, headers=action.headers, json=action.body,
                                            allow_redirects=False) as response:
                        status = response.status
                        location = response.headers.get("Location")
                        if status in REDIRECTS and location:
                            target = url.join(yarl.URL(location))
                            if target.origin() != url.origin():
                                raise WebhookRefused(f"HTTP {status} redirect to another host "
                                                     f"({target.origin()}) not followed")
                            url = target
                            continue
                        raw = await _read_limited(response.content, MAX_REPLY_BYTES)
                        break
                else:
                    raise WebhookRefused(f"more than {MAX_REDIRECTS} redirects")
            try:
                data = json.loads(raw.decode("utf-8")) if raw else None
                error = None
            except (ValueError, UnicodeDecodeError, RecursionError):
                data, error = None, f"HTTP {status} with a reply that is not JSON"
        except asyncio.TimeoutError:
            status, data, error = None, None, f"no reply within {action.timeout_s} s"
        except WebhookRefused as exc:
            data, error = None, str(exc)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            status, data, error = None, None, f"{type(exc).__name__}: {exc}"
        seconds = time.monotonic() - t0
        if error:
            error = scrub(error)
            bound_log.warning("webhook_failed", node=action.node, url=scrub(action.url), error=error)
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
