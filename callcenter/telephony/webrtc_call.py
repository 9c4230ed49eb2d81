"""A call from a browser (the /call page), on its aiortc peer connection."""

from __future__ import annotations

import asyncio

from callcenter.telephony.live_call import ConsultLeg, LiveCall, Switchboard
from callcenter.telephony.sip import TRANSFER_WAIT_S


class WebRtcLiveCall(LiveCall):
    """A call from a browser (the /call page): one aiortc peer connection. A browser cannot be
    REFERred, so a transfer of either kind calls the person over SIP and relays the audio between
    the two legs; the agent stays in the media path, as for a warm transfer on a phone line."""

    transport = "webrtc"
    transfer_bridges = True

    def __init__(self, agent: Switchboard, peer, remote_address: str):
        remote = f"webrtc:{remote_address}"
        super().__init__(agent, peer.call_id, remote, {"caller": remote, "caller_number": ""})
        self.peer = peer
        self._closed = False
        peer.attach(self.bridge.caller_frame, self.bridge.agent_frame, self, asyncio.get_running_loop())

    @property
    def ended(self) -> bool:
        return self._closed

    def on_disconnected(self, code: int, reason: str) -> None:
        self._closed = True
        super().on_disconnected(code, reason)

    def on_confirmed(self) -> None:
        """Connected: now the call takes a slot, if one is still free (offers that never connect
        hold none, so a slot can have gone to a phone call meanwhile)."""
        if self.agent.full(exclude=self):
            self.log.warning("webrtc_busy_at_connect", max_calls=self.agent.config.max_calls)
            asyncio.create_task(self.hangup())
            return
        super().on_confirmed()

    def on_dtmf(self, digit: str) -> None:
        if self.task is not None:
            self.session.on_dtmf(digit, source="datachannel")

    async def hangup(self) -> None:
        self._closed = True
        await self.agent.webrtc.hang_up(self.peer, "agent")

    async def transfer(self, uri: str) -> bool:
        return await self.warm_transfer(uri, None, TRANSFER_WAIT_S, None)

    async def _connect_person(self, leg: ConsultLeg) -> None:
        leg.relay_with(self.bridge)

    def _finish(self) -> None:
        super()._finish()
        if self.agent.webrtc is not None:
            self.agent.webrtc.ended(self.call_id)
