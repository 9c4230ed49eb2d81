"""A caller's wait in a queue of human agents (the call side of `call/queues.py`).

`QueueWait` joins the shared store, and while this caller is first in line and an agent of the
queue is free, rings the agent(s) the store picks (one, or all for ring_all) on the caller's
transport: the first to answer hears the triage summary alone (the whisper), then is connected to
the caller. A phone that rings out is left for the next agent (the caller keeps their place); a
phone that refuses the call (not registered, busy, an error) pauses its agent with the reason, as
Asterisk's autopause does, so callers are not held up ringing it again. When the agent hangs up
they go into the queue's wrap-up time. The session around it plays the hold music and the
announcements, and ends the wait on its max time, the callback key, or the caller hanging up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Protocol

import structlog

from callcenter.call import events as ev
from callcenter.store.queues import Agent, QueueStore, QueueStoreError

POLL_S = 0.2  # how often a waiting caller looks for a free agent (agent free -> phone ringing)
log = structlog.get_logger()


class AgentLeg(Protocol):
    """The agent's call, placed by the caller's transport (see telephony.live_call.ConsultLeg)."""
    bridge: object
    confirmed: asyncio.Future  # answered (or failed with the SIP status)
    ended: asyncio.Future

    async def media_up(self) -> None: ...  # the answered leg's audio is connected (TimeoutError if not)
    def close(self) -> None: ...


def unreachable(error: str) -> bool:
    """Does the SIP failure say the agent's phone is not there (not registered, not found, a server
    error), rather than that they did not take this call (busy, declined)?"""
    code = error.split(" ", 1)[0]
    return not code.isdigit() or int(code) in (403, 404, 408, 410, 480) or int(code) >= 500


class QueueWait:
    def __init__(self, store: QueueStore, call_id: str, queue: str, settings, whisper: str,
                 dial: Callable[[str, str], Awaitable[AgentLeg]],
                 connect: Callable[[AgentLeg], Awaitable[None]],
                 speak: Callable[[object, str], Awaitable[None]], events,
                 free_slots: Callable[[], int] = lambda: 1, center: Callable[..., None] = lambda **_: None):
        self.store = store
        self.call_id = call_id
        self.queue = queue
        self.settings = settings
        self.whisper = whisper
        self._dial = dial
        self._connect = connect
        self._speak = speak
        self.events = events
        self._free_slots = free_slots
        self._center = center  # the contact center's own record (an agent paused as unreachable)
        self.result: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.agent: Agent | None = None
        self.leg: AgentLeg | None = None
        self._ringing: list[AgentLeg] = []
        self._task: asyncio.Task | None = None
        self._joined = time.monotonic()

    def start(self) -> "QueueWait":
        self.store.join(self.call_id, self.queue)
        self._joined = time.monotonic()
        self.events.emit(ev.QUEUE, what="joined", queue=self.queue)
        self._task = asyncio.create_task(self._run())
        return self

    def position(self) -> tuple[int, int, float]:
        """(place, callers in the queue, expected wait in seconds)."""
        place, total = self.store.position(self.call_id)
        return place, total, self.store.expected_wait_s(self.call_id)

    async def _run(self) -> None:
        try:
            while not self.result.done():
                ring = self.store.claim(self.call_id, self._free_slots())
                if ring is None:
                    await asyncio.sleep(POLL_S)
                    continue
                if await self._ring(ring.agents):
                    return
                await asyncio.sleep(POLL_S)  # never a tight loop of calls, whatever the phones answer
        except QueueStoreError as exc:
            log.error("queue_store_failed", error=str(exc))
            self._finish("unavailable")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("queue_wait_failed")
            self._finish("unavailable")

    async def _ring(self, agents: tuple[Agent, ...]) -> bool:
        """Ring these agents; True when one answered and is now connected to the caller."""
        names = [a.name for a in agents]
        self.events.emit(ev.QUEUE, what="ring", queue=self.queue, agents=names)
        legs: dict[str, AgentLeg] = {}
        refused: dict[str, str] = {}  # the agent's phone cannot be reached: they are paused
        declined: list[str] = []  # turned down at once (busy, declined): not rung again for a while
        for a in agents:
            try:
                legs[a.name] = await self._dial(a.uri, a.name)
            except Exception as exc:  # no call slot left here (not the agent's fault): free again
                log.warning("agent_not_dialled", agent=a.name, error=str(exc) or type(exc).__name__)
        self._ringing = list(legs.values())
        winner = None
        waits = {asyncio.ensure_future(asyncio.shield(leg.confirmed)): name for name, leg in legs.items()}
        deadline = asyncio.get_running_loop().time() + self.settings.ring_timeout_s
        pending = set(waits)
        while pending and winner is None:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            done, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                name = waits[fut]
                if fut.exception() is None and winner is None:
                    winner = name
                elif fut.exception() is not None and unreachable(str(fut.exception())):
                    refused[name] = str(fut.exception())
                elif fut.exception() is not None:
                    declined.append(name)
        for fut in pending:
            fut.cancel()
        self._ringing = []
        for name, leg in legs.items():
            if name != winner:
                leg.close()
        if winner is not None and self.result.done():  # the caller left while it was answered
            legs[winner].close()
            winner = None
        unanswered = [n for n in names if n != winner and n not in refused]
        for name, why in refused.items():
            self.events.emit(ev.QUEUE, what="agent_unreachable", queue=self.queue, agent=name, error=why)
            log.warning("agent_unreachable", agent=name, error=why)
            self._center(agent=name, action="autopause", state="paused", reason=f"unreachable: {why}", by="queue")
        if winner is None:
            self.store.ring_ended(self.call_id, None, names, unreachable=refused, declined=declined)
            if unanswered:
                self.events.emit(ev.QUEUE, what="no_answer", queue=self.queue, agents=unanswered)
            return False
        leg = legs[winner]
        self.store.ring_ended(self.call_id, winner, names, unreachable=refused)
        self.agent = next(a for a in agents if a.name == winner)
        self.leg = leg
        answered_at = time.monotonic()
        waited = round(answered_at - self._joined, 1)
        self.events.emit(ev.QUEUE, what="answered", queue=self.queue, agent=winner, waited_s=waited)
        try:
            await leg.media_up()
            self.events.emit(ev.AGENT_WHISPER, agent=winner, text=self.whisper)
            await self._speak(leg.bridge, self.whisper)
            if leg.ended.done():
                raise ConnectionError("the agent hung up during the whisper")
            await self._connect(leg)
        except (Exception, asyncio.TimeoutError) as exc:
            log.warning("agent_leg_failed", agent=winner, error=str(exc) or type(exc).__name__)
            leg.close()
            self.store.agent_call_ended(winner, self.queue, 0.0, 0.0)
            self.agent = self.leg = None
            self.store.join(self.call_id, self.queue)  # back in line (at the end: rare, and said in the log)
            return False
        asyncio.create_task(self._wrap_up_after(leg, winner, answered_at))
        self._finish("answered")
        return True

    async def _wrap_up_after(self, leg: AgentLeg, name: str, answered_at: float) -> None:
        await asyncio.shield(leg.ended)
        self.store.agent_call_ended(name, self.queue, self.settings.wrap_up_s, time.monotonic() - answered_at)

    def _finish(self, result: str) -> None:
        if not self.result.done():
            self.result.set_result(result)

    def leave(self, kind: str, callback: tuple[str, str, int, float] | None = None) -> None:
        """The caller leaves unanswered: `timeout`, `callback`, or `abandoned` (hung up). With
        `callback` (number, flow, attempts, retry_s) they keep their place, to be dialled."""
        if self.result.done():
            return
        self._finish(kind)
        if self._task is not None:
            self._task.cancel()
        for leg in self._ringing:
            leg.close()
        if self.leg is not None and self.agent is not None:  # hung up while the agent heard the whisper
            self.leg.close()
            self.store.agent_call_ended(self.agent.name, self.queue, 0.0, 0.0)
        self.store.leave(self.call_id, kind, callback)
        self.events.emit(ev.QUEUE, what="left", queue=self.queue, why=kind,
                         waited_s=round(time.monotonic() - self._joined, 1))
