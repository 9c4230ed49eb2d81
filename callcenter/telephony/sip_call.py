"""Calls on a SIP line: a caller's call (`SipLiveCall`: one pjsua2 dialog on the SIP thread and
its session on the loop), and a human agent's keypad code (`AgentCodeCall`)."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from callcenter.call.bridge import MediaBridge
from callcenter.telephony.live_call import ConsultLeg, LiveCall, Switchboard, caller_variables, new_call_id
from callcenter.telephony.sip import SIP_OK, TRANSFER_WAIT_S, CallInfo, SipCall, SipError

log = structlog.get_logger()


class SipLiveCall(LiveCall):
    """A call on a SIP line: one pjsua2 dialog (on the SIP thread) and its session (on the loop)."""

    def __init__(self, agent: Switchboard, call: SipCall, info: CallInfo):
        super().__init__(agent, new_call_id("sip"), info.remote_uri, caller_variables(info.remote_uri),
                         {"sip_call_id": info.call_id})
        self.call = call
        self.info = info
        self._transfer: asyncio.Future | None = None
        call.bridge = self.bridge
        call.listener = self

    @property
    def ended(self) -> bool:
        return self.call.disconnected

    def on_transfer_status(self, code: int, reason: str, final: bool) -> None:
        self.log.info("transfer_status", code=code, reason=reason, final=final)
        # provisional NOTIFYs (100 Trying) say nothing yet; the final one says whether the phone
        # reached the destination
        if self._transfer and not self._transfer.done() and (final or code >= 200):
            self._transfer.set_result(200 <= code < 300)

    async def hangup(self) -> None:
        with contextlib.suppress(SipError):
            await self.agent.endpoint.run_on_sip(self.call.hangup_now)

    async def transfer(self, uri: str) -> bool:
        self._transfer = asyncio.get_running_loop().create_future()
        try:
            await self.agent.endpoint.run_on_sip(self.call.refer, uri)
            async with asyncio.timeout(TRANSFER_WAIT_S):
                return await self._transfer
        except (SipError, asyncio.TimeoutError) as exc:
            self.log.warning("transfer_failed", to=uri, error=str(exc) or "no answer to REFER")
            return False
        finally:
            self._transfer = None

    async def _connect_person(self, leg: ConsultLeg) -> None:
        await self.agent.endpoint.run_on_sip(self.call.bridge_to, leg.call)


AGENT_CODES = {"*41": "login", "*42": "logout", "*45": "pause", "*46": "resume"}
AGENT_CODE_SAID = {"login": "you are signed in and taking calls", "logout": "you are signed out",
                   "pause": "you are paused", "resume": "you are available again"}


class AgentCodeCall:
    """A human agent dialled a keypad code from their phone (`*41` log in, `*42` log out, `*45`
    pause, `*46` resume), as in Asterisk's agent logins: the project's Kamailio authenticated them
    and named them in X-Callcenter-Agent. The worker changes their state, says so, and hangs up."""

    def __init__(self, agent: Switchboard, call: SipCall, info: CallInfo):
        from callcenter.store.queues import QueueStoreError

        self.agent, self.call = agent, call
        self.log = log.bind(agent=info.agent, code=info.dialled)
        self.bridge = MediaBridge(asyncio.get_running_loop(), None)
        call.bridge, call.listener = self.bridge, self
        action = AGENT_CODES.get(info.dialled)
        if action is None:
            self.text = ("Sorry, that code is not known. Star four one logs you in, star four two logs you out, "
                         "star four five pauses you, and star four six makes you available again.")
        else:
            try:
                agent.queues.set_agent_state(info.agent, action, "keypad" if action == "pause" else "")
                self.text = f"{info.agent}, {AGENT_CODE_SAID[action]}."
                self.log.info("agent_state", action=action, by="keypad")
                if agent.control is not None:
                    agent.control.agent_changed(info.agent, action, "keypad")
                else:
                    agent.center_event("agent_state", agent=info.agent, action=action, by="keypad",
                                       state=agent.queues.agent(info.agent).state.value)
            except QueueStoreError as exc:
                self.text = f"Sorry, {exc}."
                self.log.warning("agent_code_refused", error=str(exc))
        self._drain = asyncio.create_task(self._discard())
        agent.endpoint.call_soon(call.answer_with, SIP_OK)

    async def _discard(self) -> None:
        while True:
            await self.bridge.caller_frames.get()

    def on_confirmed(self) -> None:
        asyncio.create_task(self._say_and_hang_up())

    async def _say_and_hang_up(self) -> None:
        played = asyncio.get_running_loop().create_future()
        self.bridge.on_playout(lambda utt, at: None, lambda utt, at: played.done() or played.set_result(at))
        try:
            first = True
            async for frame in self.agent.tts.stream(self.text, self.agent.flows.current.voice):
                self.bridge.play(frame, 1, first=first)
                first = False
            self.bridge.end_utterance(1)
            async with asyncio.timeout(30):
                await played
        except Exception as exc:
            self.log.error("agent_code_reply_failed", error=str(exc))
        await asyncio.sleep(0.3)
        self.agent.endpoint.call_soon(self.call.hangup_now)

    def on_disconnected(self, code: int, reason: str) -> None:
        self._drain.cancel()
        self.bridge.close()
