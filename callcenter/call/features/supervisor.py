"""A supervisor's hands on a live call (through the control API): say a sentence, take the call
over and give it back, freeze the agent, transfer, queue, hang up with a goodbye, mark for review."""

from __future__ import annotations

import asyncio

from callcenter.call import events as ev
from callcenter.call.state import CallState
from callcenter.dialog.engine import Enqueue, Hangup, Say, Transfer, Waiting

SUPERVISOR_GOODBYE = "Thank you for calling. Goodbye."  # said before a supervisor's hang-up


class Supervision:
    def __init__(self, call):
        self.call = call
        self.heard_while_held = False  # the caller spoke to the supervisor: ask again on release
        self.marked: str | None = None

    @property
    def held(self) -> bool:
        """A supervisor took the call over (or paused it): the flow does not act."""
        return self.call.status.held

    @property
    def paused(self) -> bool:
        return self.call.status.state == CallState.PAUSED

    def heard(self, text: str) -> None:
        """The caller said something while the supervisor has the call (heard and logged, not answered)."""
        self.heard_while_held = self.heard_while_held or bool(text)

    def say(self, text: str) -> None:
        """Speak a sentence the supervisor typed, in the call's voice, now: what the agent was saying
        stops. The flow goes on afterwards unless the call is taken over."""
        call = self.call
        call.speaking.interrupt(reason="supervisor", emit=False)
        call.events.emit(ev.SUPERVISOR, action="say", text=text)
        call.speaking.queue.put_nowait(Say(text))

    def take_over(self) -> None:
        """The supervisor has the call: the agent stops talking and the flow stops deciding (the
        caller is still heard and transcribed) until `release()`."""
        if not self.paused:
            self.call.status.enter(CallState.TAKEN_OVER, "supervisor")
        self.call.runner.cancel_no_input()
        self.call.speaking.interrupt(reason="supervisor", emit=False)
        self.call.events.emit(ev.SUPERVISOR, action="take_over")

    def release(self) -> None:
        call = self.call
        call.status.release("supervisor")
        call.bridge.resume()
        call.events.emit(ev.SUPERVISOR, action="release")
        heard, self.heard_while_held = self.heard_while_held, False
        listen = call.runner.listen
        if call.dialog.waiting == Waiting.CALLER and listen is not None and not call.speaking.speaking:
            if heard:  # not "I didn't hear anything": the caller was talking to the supervisor
                call.tasks.keep(asyncio.create_task(call.runner.decide(call.dialog.on_resume, caller_input=False)))
            else:
                call.runner.start_no_input(listen.timeout_s)

    def pause(self) -> None:
        """Freeze the agent where it is (its voice held mid-word, the flow holding)."""
        self.call.status.enter(CallState.PAUSED, "supervisor")
        self.call.runner.cancel_no_input()
        self.call.bridge.pause()
        self.call.events.emit(ev.SUPERVISOR, action="pause")

    def _hand_off(self, **event) -> None:
        call = self.call
        call.speaking.interrupt(reason="supervisor", emit=False)
        call.status.release("supervisor")
        call.bridge.resume()
        call.features.transfer.by_supervisor = True
        call.events.emit(ev.SUPERVISOR, action="transfer", **event)

    def transfer(self, uri: str) -> None:
        """Blind transfer now. If the caller's phone refuses it, the call goes on where it was."""
        self._hand_off(to=uri)
        self.call.speaking.queue.put_nowait(Transfer(uri))

    def enqueue(self, queue: str) -> None:
        """Put the caller in one of the flow's queues of agents now (the console's transfer to a
        queue). If nobody answers before its max wait, the flow carries on where it was."""
        call = self.call
        settings = call.flow.queues[queue]
        self._hand_off(queue=queue)
        call.dialog.variables.update(queue=queue, triage=call.dialog.triage())
        call.speaking.queue.put_nowait(Enqueue(queue, settings, call.dialog.render(settings.whisper)))

    def transfer_to_agent(self, name: str, uri: str) -> None:
        """Hand the caller to one human agent now: the agent calls them, tells them the triage
        summary, then bridges (a warm transfer). If they do not answer, the flow carries on."""
        self._hand_off(agent=name, to=uri)
        summary = f"A caller the supervisor is passing to you. {self.call.dialog.triage()}"
        self.call.speaking.queue.put_nowait(Transfer(uri, "warm", summary, 20.0))

    def hangup(self, goodbye: str = SUPERVISOR_GOODBYE) -> None:
        """End the call from the console: the caller hears a goodbye first, never a line gone dead."""
        call = self.call
        call.speaking.interrupt(reason="supervisor", emit=False)
        call.dialog.finished = True
        call.events.emit(ev.SUPERVISOR, action="hangup")
        if goodbye:
            call.speaking.queue.put_nowait(Say(goodbye))
        call.speaking.queue.put_nowait(Hangup())

    def mark(self, note: str) -> None:
        self.marked = note or "marked"
        self.call.events.emit(ev.MARKED, note=self.marked)
