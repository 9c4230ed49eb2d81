"""A part of the agent failed for good (the recognizer, the voice, the flow, a task): the flow
stops, the caller is told at once, then transferred to the flow's `trouble.transfer_to` or asked
to call back."""

from __future__ import annotations

from callcenter.call import events as ev
from callcenter.dialog.engine import Hangup, Say, Transfer
from callcenter.dialog.flow import trouble_destination


class Trouble:
    def __init__(self, call):
        self.call = call
        self.active = False  # the caller is being told and transferred or let go

    def begin(self, stage: str) -> None:
        call = self.call
        if self.active or call.ended.is_set():
            return
        self.active = True
        to = trouble_destination(call.flow)
        call.log.warning("call_in_trouble", stage=stage, transfer_to=to)
        call.events.emit(ev.TROUBLE, stage=stage, transfer_to=to)
        call.speaking.interrupt(reason=f"{stage} failed")
        call.runner.cancel_no_input()
        t = call.flow.trouble
        if to is not None:
            call.runner.act([Say(f"{t.say} {t.transferring}"), Transfer(to=to, mode="blind")])
        else:
            call.runner.act([Say(f"{t.say} {t.call_back}"), Hangup()])
