"""What a call is doing, in one field, and who drives it.

`CallStatus.state` is the call's one state. The features move it (`enter`, `leave`) and every
change is checked against `TRANSITIONS` and told as a `call_state` event. While the flow has the
call (`CallState.FLOW`), what the call shows is the flow's own moment: the voice talking, the flow
working on a webhook or a model, or listening to the caller (`activity`); those come and go many
times a turn and are not events.

Who drives the call follows from its state: a person bridged in, a supervisor who took it over
(or paused it), or the flow."""

from __future__ import annotations

import asyncio
from enum import StrEnum

from callcenter.call import events as ev
from callcenter.dialog.engine import Waiting


class CallState(StrEnum):
    FLOW = "flow"  # the flow has the call: shown as listening, working or talking
    LISTENING = "listening"
    WORKING = "working"  # the flow waits on a webhook or a model
    TALKING = "talking"
    TRANSFERRING = "transferring"
    QUEUED = "queued"
    VOICEMAIL = "voicemail"
    BRIDGED = "bridged"
    PAUSED = "paused"
    TAKEN_OVER = "taken over"
    ANSWERING_MACHINE = "answering machine"  # a machine answered a dialled call: the flow stops, a message is left
    ENDED = "ended"


SUPERVISED = frozenset({CallState.TAKEN_OVER, CallState.PAUSED})
UNDER_HOLD = frozenset({CallState.TRANSFERRING, CallState.QUEUED, CallState.VOICEMAIL})  # run under a hold

# where each state may go; any state may end. A supervisor may take over (or pause) a call the
# flow, a queue wait, a transfer's ringing or a voicemail has, and gives it back to where it was.
TRANSITIONS: dict[CallState, frozenset[CallState]] = {
    CallState.FLOW: frozenset({CallState.TRANSFERRING, CallState.QUEUED, CallState.VOICEMAIL,
                               CallState.TAKEN_OVER, CallState.PAUSED, CallState.ANSWERING_MACHINE}),
    CallState.ANSWERING_MACHINE: frozenset({CallState.TAKEN_OVER, CallState.PAUSED}),
    CallState.TRANSFERRING: frozenset({CallState.FLOW, CallState.BRIDGED, CallState.TAKEN_OVER, CallState.PAUSED,
                                       CallState.ANSWERING_MACHINE}),  # a dialled call's machine found late
    CallState.QUEUED: frozenset({CallState.FLOW, CallState.BRIDGED, CallState.TAKEN_OVER, CallState.PAUSED,
                                 CallState.ANSWERING_MACHINE}),
    CallState.VOICEMAIL: frozenset({CallState.FLOW, CallState.TAKEN_OVER, CallState.PAUSED}),
    CallState.TAKEN_OVER: frozenset({CallState.PAUSED, CallState.FLOW, CallState.TRANSFERRING, CallState.QUEUED,
                                     CallState.VOICEMAIL, CallState.BRIDGED}),
    CallState.PAUSED: frozenset({CallState.TAKEN_OVER, CallState.FLOW, CallState.TRANSFERRING, CallState.QUEUED,
                                 CallState.VOICEMAIL, CallState.BRIDGED}),
    CallState.BRIDGED: frozenset(),
    CallState.ENDED: frozenset(),
}


class Driver(StrEnum):
    """Who has the call: the flow, a supervisor, or a person it was put through to."""
    FLOW = "flow"
    SUPERVISOR = "supervisor"
    PERSON = "person"


class CallStatus:
    """The call's one state field, its transitions and its `call_state` events."""

    def __init__(self, call):
        self.call = call
        self.state = CallState.FLOW
        self.given_back = CallState.FLOW  # where a supervisor's release returns the call
        self.ended = asyncio.Event()  # set with CallState.ENDED

    @property
    def driver(self) -> Driver:
        if self.state == CallState.BRIDGED:
            return Driver.PERSON
        if self.state in SUPERVISED:
            return Driver.SUPERVISOR
        return Driver.FLOW

    @property
    def held(self) -> bool:
        """A supervisor has the call (taken over or paused): the flow does not act."""
        return self.state in SUPERVISED

    @property
    def flow_stopped(self) -> bool:
        """The flow takes no more steps: a machine answered (its message is being left)."""
        return self.state == CallState.ANSWERING_MACHINE or self.given_back == CallState.ANSWERING_MACHINE

    @property
    def bridged(self) -> bool:
        """A person has the caller now (a warm transfer, a queue's agent)."""
        return self.state == CallState.BRIDGED

    def enter(self, state: CallState, reason: str = "") -> bool:
        """Move to `state`; False (and an error logged) where the table does not allow it. A
        feature that starts under a supervisor's hold runs underneath it: the call goes to it on
        release."""
        if state == self.state:
            return True
        if self.state == CallState.ENDED:  # a part finishing after the caller hung up: nothing to move
            return False
        if self.state in SUPERVISED and state in UNDER_HOLD:
            self.given_back = state
            return True
        return self._move(state, reason)

    def leave(self, state: CallState, reason: str = "") -> None:
        """The part that entered `state` is done: back to the flow (or, under a supervisor's hold,
        back to the flow on release)."""
        if self.state == state:
            self._move(CallState.FLOW, reason)
        elif self.given_back == state:
            self.given_back = CallState.FLOW

    def release(self, reason: str = "") -> None:
        """The supervisor gives the call back to where it was."""
        back, self.given_back = self.given_back, CallState.FLOW
        if self.state in SUPERVISED:
            self._move(back, reason)

    def _move(self, state: CallState, reason: str) -> bool:
        now = self.state
        if state != CallState.ENDED and state not in TRANSITIONS[now]:
            self.call.log.error("call_state_refused", state=now.value, to=state.value, reason=reason)
            return False
        if state in SUPERVISED and now not in SUPERVISED:
            self.given_back = now
        self.state = state
        if state == CallState.ENDED:
            self.ended.set()
        self.call.events.emit(ev.CALL_STATE, state=state.value, was=now.value, driver=self.driver.value,
                              **({"reason": reason} if reason else {}))
        return True

    def end(self, reason: str = "") -> None:
        self.enter(CallState.ENDED, reason)

    @property
    def shown(self) -> CallState:
        """What the call is doing now, for the console: the state, or the flow's own moment."""
        return activity(self.call) if self.state == CallState.FLOW else self.state


def activity(call) -> CallState:
    """The flow's moment: the voice talking, the flow working, or listening to the caller."""
    if call.speaking.speaking:
        return CallState.TALKING
    return CallState.LISTENING if call.dialog.waiting == Waiting.CALLER else CallState.WORKING
