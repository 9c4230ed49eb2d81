"""A WebRTC caller written with aiortc: what the /call page does, as a Python peer. Used by the tests
and `callcenter bench webrtc`. Its microphone is a WAV file (8 kHz mono, played in real time, then
silence); what it hears is kept as 8 kHz PCM; keys go over the `keypad` data channel like the page's.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np

from callcenter.audio.frames import FRAME_BYTES, FRAME_SAMPLES, SAMPLE_RATE
from callcenter.audio.wavfile import read_wav
from callcenter.errors import CallcenterError
from callcenter.telephony.webrtc import KEYPAD_CHANNEL, CallerAudio, FrameClock, av_frame


class BrowserCallError(CallcenterError, RuntimeError):
    """The gateway refused the call (busy, bad offer) or the connection did not come up."""

    def __init__(self, status: int, error: str, message: str):
        super().__init__(f"{status} {error}: {message}")
        self.status = status
        self.error = error
        self.message = message


def _mic_track_class():
    from aiortc import MediaStreamTrack
    from aiortc.mediastreams import MediaStreamError

    class WavMicrophone(MediaStreamTrack):
        """A WAV file as a live microphone: 20 ms frames in real time, then silence."""

        kind = "audio"

        def __init__(self, pcm: bytes) -> None:
            super().__init__()
            self.pcm = pcm
            self._pos = 0
            self._clock = FrameClock(reset_s=None)  # a caller's speech is never skipped, only late
            self.finished = asyncio.Event()

        def play(self, pcm: bytes) -> None:
            """Say something else from now on (after what is playing)."""
            self.pcm = self.pcm[:self._pos] + pcm if self._pos < len(self.pcm) else self.pcm + pcm
            self.finished.clear()

        async def recv(self):
            if self.readyState != "live":
                raise MediaStreamError
            await self._clock.tick()
            chunk = self.pcm[self._pos:self._pos + FRAME_BYTES]
            self._pos += len(chunk)
            if len(chunk) < FRAME_BYTES:
                chunk += bytes(FRAME_BYTES - len(chunk))
                if self._pos >= len(self.pcm):
                    self.finished.set()
            return av_frame(np.frombuffer(chunk, dtype=np.int16), SAMPLE_RATE, (self._clock.frames - 1) * FRAME_SAMPLES)

    return WavMicrophone


class BrowserCaller:
    """One WebRTC call to the agent's gateway, placed like the page places it."""

    def __init__(self, base_url: str, mic: Path | bytes | None = None, codecs: tuple[str, ...] = ("audio/PCMU",)):
        self.base_url = base_url.rstrip("/")
        pcm = read_wav(mic) if isinstance(mic, Path) else (mic or b"")
        self.mic = _mic_track_class()(pcm)
        self.codecs = codecs
        self.heard = bytearray()  # what the caller heard, 8 kHz PCM
        self.call_id: str | None = None
        self.codec: str | None = None
        self.connected = asyncio.Event()
        self.ended = asyncio.Event()
        self.bye_by: str | None = None
        self.pc = None
        self.channel = None
        self._reader: asyncio.Task | None = None

    async def call(self, timeout: float = 15) -> "BrowserCaller":
        import aiohttp
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
        from aiortc.rtcrtpsender import RTCRtpSender

        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        transceiver = self.pc.addTransceiver(self.mic, direction="sendrecv")
        caps = RTCRtpSender.getCapabilities("audio").codecs
        transceiver.setCodecPreferences([c for m in self.codecs for c in caps if c.mimeType.lower() == m.lower()])
        self.channel = self.pc.createDataChannel(KEYPAD_CHANNEL)
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{self.base_url}/call/offer",
                                 json={"sdp": self.pc.localDescription.sdp, "type": "offer"}) as r:
                body = await r.json()
                if r.status != 200:
                    await self.pc.close()
                    raise BrowserCallError(r.status, body.get("error", ""), body.get("message", ""))
        self.call_id = body["call_id"]
        self.codec = body.get("codec")
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="answer"))
        await asyncio.wait_for(self.connected.wait(), timeout)
        if self.channel.readyState != "open":  # the keypad channel opens just after the media
            opened = asyncio.Event()
            self.channel.on("open", opened.set)
            if self.channel.readyState != "open":
                await asyncio.wait_for(opened.wait(), timeout)
        return self

    async def press(self, keys: str, gap_s: float = 0.15) -> None:
        for key in keys:
            self.channel.send(json.dumps({"type": "key", "key": key}))
            await asyncio.sleep(gap_s)

    def send_raw(self, message: str) -> None:
        self.channel.send(message)

    async def hangup(self) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(json.dumps({"type": "bye"}))
            await asyncio.sleep(0.1)
        await self.close()

    async def close(self) -> None:
        if self.pc is not None:
            await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
        self.ended.set()

    def heard_seconds(self) -> float:
        return len(self.heard) / 2 / SAMPLE_RATE

    # ---- aiortc events
    def _on_message(self, message) -> None:
        try:
            msg = json.loads(message)
        except (TypeError, ValueError):
            return
        if isinstance(msg, dict) and msg.get("type") == "bye":
            self.bye_by = msg.get("by")
            self.ended.set()

    def _on_track(self, track) -> None:
        if track.kind == "audio":
            self._reader = asyncio.create_task(self._read(track))

    async def _read(self, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        audio = CallerAudio()
        try:
            while True:
                for pcm in audio.push(await track.recv()):
                    self.heard += pcm
        except MediaStreamError:
            self.ended.set()

    async def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self.connected.set()
        elif self.pc.connectionState in ("failed", "closed"):
            self.ended.set()
