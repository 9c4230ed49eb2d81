"""Putting the caller through: blind (REFER) or warm (the agent rings the person, tells them the
triage summary, then bridges). A failed transfer goes back to whoever asked for it: the flow, the
supervisor, or the trouble path."""

from __future__ import annotations

import asyncio

from callcenter.call import events as ev
from callcenter.call.state import CallState
from callcenter.dialog.engine import Hangup, Say, Transfer

GOODBYE_GRACE_S = 0.3  # let the last frame reach the caller before BYE/REFER


class Transferring:
    def __init__(self, call):
        self.call = call
        self.by_supervisor = False  # the supervisor's own transfer: if it fails, the flow carries on

    async def carry_out(self, action: Transfer) -> bool:
        """True when the call is over for the agent (put through, or bridged to a person)."""
        call = self.call
        await asyncio.sleep(GOODBYE_GRACE_S)
        call.ending_by = "transfer"
        call.status.enter(CallState.TRANSFERRING, action.mode)
        call.events.emit(ev.TRANSFER, to=action.to, mode=action.mode)
        if action.mode == "warm":
            ok = await call.control.warm_transfer(action.to, action.summary, action.ring_s, call.speaking.brief)
        else:
            ok = await call.control.transfer(action.to)
        call.events.emit(ev.TRANSFER, to=action.to, mode=action.mode, accepted=ok)
        if ok:
            call.result.transferred_to = action.to
            # bridged (warm, or any transfer of a caller that cannot be REFERred): the call goes on
            # until either side hangs up
            if action.mode == "warm" or call.control.transfer_bridges:
                call.status.enter(CallState.BRIDGED, action.mode)
                return True
            call.end("transfer")
            return True
        call.ending_by = None
        call.status.leave(CallState.TRANSFERRING, "not accepted")
        if call.in_trouble:  # nobody to take the caller: ask them to call back
            call.runner.act([Say(call.flow.trouble.call_back), Hangup()])
            return False
        if self.by_supervisor:
            self.by_supervisor = False
            return False
        await call.runner.decide(call.dialog.on_transfer_failed, caller_input=False)
        return False
