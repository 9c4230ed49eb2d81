"""An OpenAI-compatible chat-completions server on loopback that answers at once: the remote
protocol's own cost (request, streamed reply, sentence splitting) with no model behind it.

`bench call --references` points a copy of the flow's llm nodes at it (`kind: openai`), so that a
remote provider's turns are measured in the same run as the offline model's. A real server adds
its own time to first token on top.
"""

from __future__ import annotations

import asyncio
import json
import threading

REPLY = ("I can help with that. ", "Could you tell me a little more?")


class LlmStub:
    """Runs in a thread of its own; `url` is the base URL to give as the provider's `base_url`."""

    def __init__(self, reply: tuple[str, ...] = REPLY):
        self.reply = reply
        self.url = ""
        self.requests = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    async def _completions(self, request):
        from aiohttp import web

        await request.json()
        self.requests += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in self.reply:
            await response.write(f"data: {json.dumps({'choices': [{'delta': {'content': piece}}]})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _serve(self, ready: threading.Event) -> None:
        from aiohttp import web

        from callcenter.flowtest import serve_loopback

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        self._stop = asyncio.Event()
        async with serve_loopback(app) as url:
            self.url = f"{url}/v1"
            ready.set()
            await self._stop.wait()

    def __enter__(self) -> "LlmStub":
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(ready),),
                                        name="llm-stub", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the loopback LLM stub did not start")
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
