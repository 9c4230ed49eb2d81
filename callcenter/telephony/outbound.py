"""Placing a call: `callcenter dial` and the control API's `POST /api/dial` ask the server to dial
a number or a SIP URI and run one of its outbound flows on the call.

Nothing is dialled that the server config's `outbound.allow` does not list (and `outbound.deny`
does not refuse): outbound calling must never become toll fraud. A number is sent to the trunk
(`outbound.trunk`, else the registrar's domain) with the configured caller ID. The call takes a
call slot like any other, is recorded and evented like any other, and its row in the store says
`outbound` and how it ended: `no_answer`, `busy` and `failed` for a call nobody answered, else
the outcome its flow gave it."""

from __future__ import annotations

import asyncio
import fnmatch
import re
import time

from callcenter.call.call_row import CallRow
from callcenter.dialog.flow import BUILTIN_VARIABLES, VAR_NAME, Flow
from callcenter.errors import CallcenterError
from callcenter.store.calls import BUSY, FAILED, NO_ANSWER, CallEnd
from callcenter.telephony.config import Outbound
from callcenter.telephony.live_call import LiveCall, Switchboard, new_call_id
from callcenter.telephony.sip import CallInfo, SipError
from callcenter.telephony.sip_call import SipLiveCall
from callcenter.text.phone import phone_number

DIAL_URI = re.compile(r"^sips?:[A-Za-z0-9_.!~*'()&=+$,;?/%\-]+@[A-Za-z0-9.\-\[\]:]+$")
MAX_VARIABLES = 50
MAX_VALUE_CHARS = 500
BUSY_CODES = (486, 600, 603)  # Busy Here, Busy Everywhere, Decline
NO_ANSWER_CODES = (408, 480, 487)  # Request Timeout, Temporarily Unavailable, Request Terminated (our CANCEL)

# a dialled call's progress, as `GET /api/dial/{call_id}` reports it
DIALLING, RINGING, ANSWERED, ENDED = "dialling", "ringing", "answered", "ended"


class DialRefused(CallcenterError, ValueError):
    """A dial the server will not place; `status` is the HTTP status the control API answers."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def destination(to: str, outbound: Outbound, registrar_domain: str | None = None) -> str:
    """The SIP URI to dial for `to` (a number or a SIP URI), if the config allows it."""
    to = to.strip()
    number = phone_number(to)
    if number is not None:
        to = number
        trunk = outbound.trunk or registrar_domain
        if not trunk:
            raise DialRefused(f"{to}: a number needs outbound.trunk (or a registration) to be sent to")
        uri = f"sip:{to}@{trunk.removeprefix('sip:')}"
    elif DIAL_URI.fullmatch(to):
        uri = to
    else:
        raise DialRefused(f"{to!r} is neither a phone number (+14155550100) nor a SIP URI (sip:user@host)")
    if any(fnmatch.fnmatchcase(to, p) for p in outbound.deny):
        raise DialRefused(f"{to} is refused by outbound.deny", 403)
    if not any(fnmatch.fnmatchcase(to, p) for p in outbound.allow):
        raise DialRefused(f"{to} matches no pattern in outbound.allow: nothing else is dialled", 403)
    return uri


def dial_variables(given: dict, flow: Flow) -> dict[str, str]:
    """The dial's variables for the flow: names the flow declares in its `variables:` (never a
    built-in, a secret from the environment, or a slot the person called fills), values as short
    text."""
    if not isinstance(given, dict):
        raise DialRefused("variables must be an object of name: value")
    if len(given) > MAX_VARIABLES:
        raise DialRefused(f"at most {MAX_VARIABLES} variables")
    slots = {n for node in flow.nodes.values() for n in (getattr(node, "slots", None) or {})}
    out = {}
    for name, value in given.items():
        if not isinstance(name, str) or not VAR_NAME.match(name):
            raise DialRefused(f"variable {name!r}: letters, digits and _, not starting with a digit")
        if name in BUILTIN_VARIABLES or name == "direction":
            raise DialRefused(f"variable {name!r} is set by the call itself and cannot be given")
        if name in flow.env:
            raise DialRefused(f"variable {name!r} is read from the server's environment and cannot be given")
        if name in slots:
            raise DialRefused(f"variable {name!r} is a slot of flow {flow.name!r}: the person called fills it")
        if name not in flow.variables:
            raise DialRefused(f"flow {flow.name!r} declares no variable {name!r} (its `variables:`: "
                              f"{', '.join(sorted(flow.variables)) or 'none'})")
        if isinstance(value, (dict, list)) or value is None:
            raise DialRefused(f"variable {name!r}: give text or a number")
        text = str(value)
        if len(text) > MAX_VALUE_CHARS:
            raise DialRefused(f"variable {name!r}: at most {MAX_VALUE_CHARS} characters")
        out[name] = text
    return out


class OneFlow:
    """A flow made for one purpose (a callback's), where a dial's flow library is expected."""

    def __init__(self, flow: Flow):
        self.current, self.digest = flow, f"generated:{flow.name}"


class OutboundSipCall(SipLiveCall):
    """A call the server placed: it rings, then (answered) runs its flow like any call; unanswered,
    its row says why."""

    direction = "outbound"

    def __init__(self, agent: Switchboard, uri: str, to: str, library, variables: dict[str, str],
                 outbound: Outbound, caller_id: str | None = None):
        number = phone_number(to) or ""
        LiveCall.__init__(self, agent, new_call_id("out"), uri,
                          {"caller": uri, "caller_number": number, "direction": "outbound", **variables},
                          library=library)
        self.to, self.outbound = to, outbound
        self.presented = caller_id or outbound.caller_id  # a campaign's own caller ID, else the server's
        self.call = None
        self.info: CallInfo | None = None
        self._transfer = None
        self.progress = DIALLING
        self.sip_code: int | None = None
        self.outcome: str | None = None  # how it ended, in the store's words
        self._ringing: asyncio.TimerHandle | None = None
        self._rang_out = False

    @property
    def ended(self) -> bool:
        return self.call is None or self.call.disconnected

    async def dial(self) -> None:
        """Place the call (SipError: no free slot, a URI pjsip refuses)."""
        endpoint = self.agent.endpoint
        caller_id = self.presented
        headers = {"P-Asserted-Identity": f"<{caller_id if ':' in caller_id else 'tel:' + caller_id}>"} \
            if caller_id else None
        self.call = await endpoint.run_on_sip(endpoint.make_call, self.remote_uri, self, self.bridge, headers)
        self.info = self.call.info
        if self.progress != DIALLING:  # answered (or refused) before pjsua handed the call back
            return
        self.progress = RINGING
        self.log.info("dial_ringing", to=self.to, ring_s=self.outbound.ring_s)
        self._ringing = asyncio.get_running_loop().call_later(self.outbound.ring_s, self._rang_out_unanswered)

    def _rang_out_unanswered(self) -> None:
        if self.progress == RINGING and self.call is not None:
            self._rang_out = True
            self.agent.endpoint.call_soon(self.call.hangup_now)  # CANCEL

    def on_confirmed(self) -> None:
        if self._ringing is not None:
            self._ringing.cancel()
        self.progress = ANSWERED
        super().on_confirmed()

    def on_disconnected(self, code: int, reason: str) -> None:
        if self._ringing is not None:
            self._ringing.cancel()
        if self.progress != ANSWERED:
            self.sip_code = code
            self.outcome = NO_ANSWER if self._rang_out or code in NO_ANSWER_CODES else \
                BUSY if code in BUSY_CODES else FAILED
            self.log.info("dial_unanswered", to=self.to, code=code, reason=reason, outcome=self.outcome)
            self._unanswered_row()
        super().on_disconnected(code, reason)

    def _unanswered_row(self) -> None:
        row = CallRow(self.agent.calls, self.agent.outbox, self.call_id)
        flow = self.session.flow
        row.started(direction=self.direction, transport=self.transport, caller=self.remote_uri,
                    caller_number=self.caller_id.get("caller_number", ""), flow=flow.name,
                    flow_version=flow.version, answered=False)
        row.ended(CallEnd(outcome=self.outcome, nodes=[]))
        self.agent.post_call.call_ended(self.call_id, [])

    def _finish(self) -> None:
        super()._finish()  # an answered call's outcome comes from its flow
        self.progress = ENDED

    def summary(self) -> dict:
        """What `GET /api/dial/{call_id}` and `callcenter dial --wait` report."""
        answered_and_over = self.task is not None and self.progress == ENDED
        return {"call_id": self.call_id, "to": self.to, "flow": self.session.flow.name, "state": self.progress,
                "outcome": self.outcome, "sip_code": self.sip_code,
                "ended_by": self.session.result.ended_by if answered_and_over else None,
                "started": round(self.started_wall, 3), "age_s": round(time.time() - self.started_wall, 1)}


__all__ = ["DialRefused", "OneFlow", "OutboundSipCall", "destination", "dial_variables", "SipError"]
