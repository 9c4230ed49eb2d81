"""The flow's side of a call: one engine step at a time (caller input waits while the flow waits
on a webhook, a model, a voicemail or a transfer), a `flow_decision` event for each, the actions it
returns handed on (webhooks and model turns run here, the rest go to the speaking loop in order),
what the next turn should expect told to the listener, and the no-input timer."""

from __future__ import annotations

import asyncio

from callcenter.call import events as ev
from callcenter.dialog.engine import Fetch, Listen, Say, Think, Waiting
from callcenter.dialog.flow import LlmNode
from callcenter.hearing.turns import Expectation
from callcenter.text.expecting import Expecting

WAITING_ON_THE_AGENT = (Waiting.FETCH, Waiting.LLM, Waiting.RECORD, Waiting.TRANSFER)  # caller input waits
KEY_TIMEOUT_S = 4.0  # a caller keying a digit string who stops this long has finished


class FlowRunner:
    def __init__(self, call, services):
        self.call = call
        self.services = services  # webhooks, models, end-of-turn judges: shared by the process's calls
        self._lock = asyncio.Lock()
        self._moved = asyncio.Event()  # the dialog took a step (caller input waiting on the agent retries)
        self.in_flight = 0  # caller turns heard but not yet answered
        self.listen: Listen | None = None  # what the flow last listened for
        self._no_input: asyncio.Task | None = None

    def call_ended(self) -> None:
        self._moved.set()  # caller input waiting on the agent gives up

    async def decide(self, step, caller_input: bool = True) -> None:
        """Run one engine step. Caller input (counted in `in_flight`) waits while the flow waits for
        a webhook, a model, a voicemail or a transfer; those results themselves go straight in."""
        call = self.call
        try:
            while caller_input and call.dialog.waiting in WAITING_ON_THE_AGENT and not call.ended.is_set():
                self._moved.clear()
                await self._moved.wait()  # set by every engine step, and when the call ends
            try:
                await self._step(step)
            finally:
                self._moved.set()
        finally:
            if caller_input:
                self.in_flight = max(0, self.in_flight - 1)

    async def _step(self, step) -> None:
        call = self.call
        async with self._lock:
            if call.dialog.finished or call.ended.is_set() or call.in_trouble or call.status.flow_stopped:
                return
            try:
                actions = step()
            except Exception as exc:
                call.log.error("flow_failed", error=str(exc))
                call.events.emit(ev.ERROR, stage="flow", error=str(exc))
                call.trouble("flow")
                return
            call.features.privacy.guard()
            d = call.dialog.last_decision
            fields = {"node": d.node, "intent": d.intent, "score": round(d.score, 3), "via": d.via,
                      "next_node": call.dialog.node_name}
            if d.value is not None:
                fields["value"] = d.value
            for name, value in d.detail.items():  # the flow's own names (slots) never displace ours
                fields[name if name not in fields and name not in ev.EVENT_FIELDS else f"slot_{name}"] = value
            call.events.emit(ev.FLOW_DECISION, **fields)
            self.act(actions)
            if not actions and call.dialog.collecting_keys:
                self.start_no_input(KEY_TIMEOUT_S)  # between keys of a digit string

    def act(self, actions) -> None:
        call = self.call
        for action in actions:
            if isinstance(action, Fetch):
                call.tasks.stage(self._fetch(action))
                continue
            if isinstance(action, Think):
                call.tasks.stage(self._think(action))
                continue
            if isinstance(action, Listen):
                self.listen = action
                self._expect(action)
            call.speaking.queue.put_nowait(action)

    async def _fetch(self, action: Fetch) -> None:
        call = self.call
        call.events.emit(ev.WEBHOOK, node=action.node, url=action.url, method=action.method)
        result = await self.services.fetch(action, call.log, call.dialog.redactor.scrub)
        call.events.emit(ev.WEBHOOK, node=action.node, status=result.status, ms=round(result.seconds * 1000),
                         **({"error": result.error} if result.error else {}))
        await self.decide(lambda: call.dialog.on_fetched(result.status, result.data, result.error), caller_input=False)

    async def _think(self, action: Think) -> None:
        call = self.call
        request = action.request
        gen = call.speaking.generation
        call.events.emit(ev.LLM_REQUEST, node=request.node, provider=request.provider, text=request.utterance)

        def sentence(text: str) -> None:
            if gen == call.speaking.generation and not call.ended.is_set():
                call.speaking.queue.put_nowait(Say(text))

        result = await self.services.think(action, sentence, call.log)
        call.events.emit(ev.LLM_REPLY, node=request.node, ms=round(result.seconds * 1000),
                         first_sentence_ms=round(result.first_text_s * 1000) if result.first_text_s else None,
                         text=result.reply.text if result.reply else None,
                         **({"via": result.reply.via} if result.reply is not None and result.reply.via else {}),
                         **({"error": result.error} if result.error else {}))
        await self.decide(lambda: call.dialog.on_thought(result.reply, result.error), caller_input=False)

    def _expect(self, listen: Listen) -> None:
        call = self.call
        node = call.dialog.node
        finished = self.services.end_of_turn(node.provider) \
            if listen.kind == Expecting.SPEECH and isinstance(node, LlmNode) else None
        call.hearing.listener.expecting(Expectation(listen.kind, listen.end_silence_ms, listen.digits_min,
                                                    listen.digits_max, answers=call.dialog.would_answer,
                                                    finished=finished))

    # ------------------------------------------------------------ no input
    def start_no_input(self, timeout_s: float) -> None:
        self.cancel_no_input()
        self._no_input = asyncio.create_task(self._no_input_after(timeout_s))

    def cancel_no_input(self) -> None:
        if self._no_input and not self._no_input.done():
            self._no_input.cancel()
        self._no_input = None

    async def _no_input_after(self, timeout_s: float) -> None:
        call = self.call
        await asyncio.sleep(timeout_s)
        if not call.hearing.listener.in_speech and not call.features.supervision.held:
            call.events.next_turn()
            self.in_flight += 1
            await self.decide(call.dialog.on_no_input)
