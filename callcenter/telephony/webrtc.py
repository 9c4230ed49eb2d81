"""Callers from a web browser: a WebRTC leg (aiortc) beside the SIP lines.

The agent serves a page (`/call`) with a call button. The browser posts its SDP offer to
`/call/offer` and gets the answer back in the same request (no trickle ICE: aiortc answers with all
of its candidates). PCMU is preferred, so a browser call stays at 8 kHz end to end like a phone
line; Opus is accepted and resampled once at the edge (48 kHz in, 48 kHz out; `audio.resample`, not
soxr, whose stream mode releases audio in blocks of up to 140 ms at 20 ms chunks). aiortc has
no RFC 4733 telephone-events, so the page's keypad sends digits on a data channel named `keypad`;
tones played into the microphone are still caught by the call's in-band detector.

`WebRtcPeer` is one browser leg: it turns the decoded RTP into 20 ms frames for a `MediaBridge`
and paces the bridge's outgoing frames at the line's 20 ms clock. Every peer lives on one
`MediaThread`, an event loop of its own, as pjsua2's media has its own thread: the senders keep
their 20 ms clock while the calls' sessions keep the main loop busy. `WebRtcGateway` is the HTTP
side and caps how many browser calls run at once (aiortc costs a good share of a core per call).
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import functools
import json
import re
import threading
import time
import uuid
from importlib import resources
from typing import Callable, Protocol

import numpy as np
import structlog

from callcenter.audio.frames import FRAME_BYTES, FRAME_SAMPLES, SAMPLE_RATE
from callcenter.audio.resample import Resampler
from callcenter.errors import CallcenterError

log = structlog.get_logger()

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
OPUS_RATE = 48000
PREFERRED_CODECS = ("audio/PCMU", "audio/opus")  # in this order; anything else is refused
KEYPAD_CHANNEL = "keypad"
KEYPAD_KEYS = frozenset("0123456789*#ABCD")
CONNECT_TIMEOUT_S = 8.0  # from the answer to ICE + DTLS connected (the config's webrtc.connect_timeout_s)
PENDING_PER_CALL = 2  # answered offers still connecting, per browser call slot (one per address)
LATE_RESET_S = 0.2  # a sender this far behind its clock starts afresh instead of sending a burst
MAX_OFFER_BYTES = 64 * 1024
SILENCE_PCM = bytes(FRAME_BYTES)
BUSY_MESSAGE = "All our lines are busy right now. Please try again in a few minutes, or call us by phone."


class WebRtcError(CallcenterError):
    """A bad offer, or a browser leg that could not be set up."""


def own_addresses() -> frozenset:
    """This machine's own interface addresses (a browser on the agent's host offers these)."""
    import ipaddress

    import ifaddr

    out = set()
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            try:
                out.add(ipaddress.ip_address(ip.ip if isinstance(ip.ip, str) else ip.ip[0]))
            except ValueError:
                continue
    return frozenset(out)


_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ (\S+) \d+ ", re.IGNORECASE)


def keep_candidates(sdp: str, allowed) -> tuple[str, list[str]]:
    """The offer with only the ICE candidates whose address `allowed(address)` accepts: the address
    the offer came from, this machine's own, or the config's `peer_networks` (mDNS
    `.local` names are kept: they resolve on the caller's own network only). Returns the SDP and the
    addresses dropped. Without this an offer could make the agent send STUN checks to any address."""
    kept, dropped = [], []
    for line in sdp.splitlines():
        m = _CANDIDATE.match(line)
        if m and not m.group(1).lower().endswith(".local") and not allowed(m.group(1)):
            dropped.append(m.group(1))
            continue
        kept.append(line)
    return "\r\n".join(kept) + "\r\n", dropped


def use_host_candidates(addresses: list[str]) -> None:
    """Offer these addresses as the ICE host candidates instead of aioice's choice (every interface's
    address except loopback). Set from the config's `webrtc.candidates`: a deployment names its
    public interface, a loopback test names 127.0.0.1. Process-wide, as aioice's lookup is."""
    import aioice.ice

    wanted = list(addresses)

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in wanted if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses


def negotiated_codec(sdp: str) -> tuple[str, int]:
    """The codec an answer sends with: the first payload type of its audio m-line, by its rtpmap
    (static payload types 0 and 8 may come without one). Returns ("PCMU", 8000), ("opus", 48000)..."""
    m = re.search(r"^m=audio \d+ \S+ (\d+)", sdp, re.MULTILINE)
    if not m:
        raise WebRtcError("the answer has no audio m-line")
    pt = m.group(1)
    rtpmap = re.search(rf"^a=rtpmap:{pt} ([^/\s]+)/(\d+)", sdp, re.MULTILINE)
    if rtpmap:
        return rtpmap.group(1), int(rtpmap.group(2))
    static = {"0": ("PCMU", SAMPLE_RATE), "8": ("PCMA", SAMPLE_RATE)}
    if pt in static:
        return static[pt]
    raise WebRtcError(f"no rtpmap for payload type {pt}")


class CallerAudio:
    """aiortc's decoded frames (8 kHz mono from PCMU, 48 kHz stereo from Opus, any size) → the
    line's 20 ms 8 kHz mono frames. Opus is resampled in one stream per call."""

    def __init__(self) -> None:
        self._buf = np.zeros(0, dtype=np.int16)
        self._rate: int | None = None
        self._resampler = None

    def push(self, frame) -> list[bytes]:
        samples = frame.to_ndarray()
        channels = len(frame.layout.channels)
        if samples.dtype != np.int16:  # planar float from another decoder
            samples = np.clip(samples * 32768.0, -32768, 32767).astype(np.int16)
        if frame.format.is_planar:
            mono = samples.astype(np.int32).mean(axis=0)
        else:
            mono = samples.reshape(-1, channels).astype(np.int32).mean(axis=1)
        mono = mono.astype(np.int16)
        if frame.sample_rate != SAMPLE_RATE:
            if self._rate != frame.sample_rate:
                self._rate = frame.sample_rate
                self._resampler = Resampler(frame.sample_rate, SAMPLE_RATE)
            mono = self._resampler.process(mono)
        self._buf = np.concatenate([self._buf, mono])
        n = len(self._buf) // FRAME_SAMPLES
        out = [self._buf[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES].tobytes() for i in range(n)]
        self._buf = self._buf[n * FRAME_SAMPLES:]
        return out


class FrameClock:
    """Paces a 20 ms sender on a clock anchored at its first frame: `await tick()` returns when frame
    `frames` is due. Late wake-ups are caught up; a sender `reset_s` behind starts afresh rather
    than sending a burst (None: always catch up)."""

    def __init__(self, reset_s: float | None = LATE_RESET_S) -> None:
        self.reset_s = reset_s
        self.frames = 0
        self._start: float | None = None

    async def tick(self) -> None:
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self.frames * FRAME_S
        if due > now:
            await asyncio.sleep(due - now)
        elif self.reset_s is not None and now - due > self.reset_s:
            self._start = now - self.frames * FRAME_S
        self.frames += 1


def av_frame(samples: np.ndarray, rate: int, pts: int, layout: str = "mono"):
    """16-bit samples as a PyAV frame for aiortc's encoder (stereo: interleaved L R)."""
    import av

    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout=layout)
    frame.sample_rate = rate
    frame.pts = pts
    frame.time_base = fractions.Fraction(1, rate)
    return frame


@functools.lru_cache(maxsize=1)  # one class per process, not one per peer
def _agent_track_class():
    from aiortc import MediaStreamTrack
    from aiortc.mediastreams import MediaStreamError

    class AgentTrack(MediaStreamTrack):
        """The agent's voice towards the browser: one frame from `source()` every 20 ms, on a clock
        anchored at the first frame (late wake-ups are caught up, a long stall restarts the clock).
        At 8 kHz for PCMU; upsampled to 48 kHz for Opus."""

        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.source: Callable[[], bytes] = lambda: SILENCE_PCM
            self.rate = SAMPLE_RATE
            self._up = None
            self._clock = FrameClock()
            self._pts = 0

        def send_at(self, rate: int) -> None:
            if rate != SAMPLE_RATE:
                self._up = Resampler(SAMPLE_RATE, rate)
            self.rate = rate

        async def recv(self):
            if self.readyState != "live":
                raise MediaStreamError
            await self._clock.tick()
            samples = np.frombuffer(self.source(), dtype=np.int16)
            layout = "mono"
            if self._up is not None:  # Opus: 48 kHz, both channels ours (aiortc's upmix would lose 3 dB)
                samples = np.repeat(self._up.process(samples), 2)
                layout = "stereo"
            frame = av_frame(samples, self.rate, self._pts, layout)
            self._pts += frame.samples
            return frame

    return AgentTrack


class MediaThread:
    """An asyncio loop on a thread of its own for aiortc (ICE, DTLS, SRTP, codecs and the 20 ms
    senders of every browser call)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="webrtc-media", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def run(self, coro):
        """Run `coro` on the media loop and wait for it from the caller's loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)


class PeerListener(Protocol):
    def on_confirmed(self) -> None: ...
    def on_disconnected(self, code: int, reason: str) -> None: ...
    def on_dtmf(self, digit: str) -> None: ...


class WebRtcPeer:
    """One browser leg: an RTCPeerConnection with one audio transceiver (PCMU, then Opus) and the
    `keypad` data channel. Created and driven on the media loop. `attach()` connects it to a call's
    MediaBridge (thread-safe, called from the media thread) and to a listener, whose methods are
    called on the listener's own loop."""

    def __init__(self, stun_servers: list[str] | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection
        from aiortc.rtcrtpsender import RTCRtpSender

        self.connect_timeout_s = connect_timeout_s
        self.answered_at = time.monotonic()
        self.call_id = f"webrtc-{uuid.uuid4().hex[:16]}"
        self.log = log.bind(call_id=self.call_id)
        # no STUN unless configured: aiortc's default asks a public server, unreachable here
        servers = [RTCIceServer(urls=url) for url in (stun_servers or [])]
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=servers))
        self.track = _agent_track_class()()
        self.transceiver = self.pc.addTransceiver(self.track, direction="sendrecv")
        caps = RTCRtpSender.getCapabilities("audio").codecs
        self.transceiver.setCodecPreferences(
            [c for mime in PREFERRED_CODECS for c in caps if c.mimeType.lower() == mime.lower()])
        self.codec: tuple[str, int] | None = None
        self.remote = ""
        self._channel = None
        self._listener: PeerListener | None = None
        self._listener_loop: asyncio.AbstractEventLoop | None = None
        self._caller_frame: Callable[[bytes], None] | None = None
        self._reader: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._confirmed = False
        self._ended = False
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)

    async def answer(self, sdp: str, kind: str = "offer") -> str:
        from aiortc import RTCSessionDescription

        if kind != "offer" or not isinstance(sdp, str) or "m=audio" not in sdp:
            await self.pc.close()
            raise WebRtcError("expected an SDP offer with an audio stream")
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except Exception as exc:  # aiortc raises ValueError/OperationError/… for SDP it cannot take
            await self.pc.close()
            raise WebRtcError(f"cannot answer this offer: {exc}") from None
        answer = self.pc.localDescription.sdp
        self.codec = negotiated_codec(answer)
        self.track.send_at(self.codec[1])
        self.log.info("webrtc_answered", codec=f"{self.codec[0]}/{self.codec[1]}")
        self._watchdog = asyncio.create_task(self._connect_or_give_up())
        return answer

    def attach(self, caller_frame: Callable[[bytes], None], agent_frame: Callable[[], bytes],
               listener: PeerListener, loop: asyncio.AbstractEventLoop) -> None:
        self._caller_frame = caller_frame
        self.track.source = agent_frame
        self._listener = listener
        self._listener_loop = loop

    def _tell(self, method: str, *args) -> None:
        if self._listener is not None:
            self._listener_loop.call_soon_threadsafe(getattr(self._listener, method), *args)

    def send(self, message: dict) -> None:
        if self._channel is not None and self._channel.readyState == "open":
            self._channel.send(json.dumps(message))

    async def close(self, reason: str = "agent") -> None:
        """Hang up: tell the page (so it shows the call ended) and close the connection."""
        self.send({"type": "bye", "by": reason})
        await asyncio.sleep(0.05)  # let the bye leave before the transport closes
        await self._shutdown(200, f"closed by {reason}")

    # ---- aiortc events
    def _on_datachannel(self, channel) -> None:
        if channel.label != KEYPAD_CHANNEL:
            self.log.warning("webrtc_unknown_channel", label=channel.label)
            return
        self._channel = channel
        channel.on("message", self._on_message)

    def _on_message(self, message) -> None:
        try:
            msg = json.loads(message) if isinstance(message, str) else None
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            self.log.warning("webrtc_bad_message", message=str(message)[:80])
            return
        if msg.get("type") == "key":
            key = str(msg.get("key", ""))
            if len(key) == 1 and key in KEYPAD_KEYS:
                self._tell("on_dtmf", key)
            else:
                self.log.warning("webrtc_bad_key", key=key[:8])
        elif msg.get("type") == "bye":
            asyncio.ensure_future(self._shutdown(200, "caller hung up"))

    def _on_track(self, track) -> None:
        if track.kind == "audio" and self._reader is None:
            self._reader = asyncio.create_task(self._read(track))

    async def _read(self, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        audio = CallerAudio()
        try:
            while True:
                frame = await track.recv()
                if self._caller_frame is not None:
                    for pcm in audio.push(frame):
                        self._caller_frame(pcm)
        except MediaStreamError:
            pass
        except Exception:
            self.log.exception("webrtc_media_in_failed")

    async def _on_state(self) -> None:
        state = self.pc.connectionState
        self.log.info("webrtc_state", state=state)
        if state == "connected" and not self._confirmed:
            self._confirmed = True
            self._tell("on_confirmed")
        elif state in ("failed", "closed"):
            await self._shutdown(408 if not self._confirmed else 200, f"connection {state}")

    @property
    def connected(self) -> bool:
        return self._confirmed

    async def _connect_or_give_up(self) -> None:
        await asyncio.sleep(self.connect_timeout_s)
        if not self._confirmed:
            self.log.warning("webrtc_connect_timeout", after_s=self.connect_timeout_s)
            await self._shutdown(408, "ICE/DTLS did not connect")

    async def _shutdown(self, code: int, reason: str) -> None:
        if self._ended:
            return
        self._ended = True
        if self._watchdog is not None and self._watchdog is not asyncio.current_task():
            self._watchdog.cancel()
        self.track.stop()
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
        self._tell("on_disconnected", code, reason)


class WebRtcGateway:
    """The browser side of the agent: `/call` (the page), `POST /call/offer` (SDP offer → answer)
    (the page needs nothing else). `on_call(peer, remote)` hands each answered leg to the
    agent; at `max_calls` browser calls the offer gets 503 with a message the page shows."""

    def __init__(self, host: str, port: int, max_calls: int, on_call: Callable[[WebRtcPeer, str], None],
                 stun_servers: list[str] | None = None, process_full: Callable[[], bool] = lambda: False,
                 peer_networks: list[str] | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S):
        import ipaddress

        self.host = host
        self.port = port
        self.max_calls = max_calls
        self.rejected: collections.Counter[str] = collections.Counter()  # offers refused, by reason
        self.on_call = on_call
        self.stun_servers = stun_servers or []
        self.peer_networks = [ipaddress.ip_network(n, strict=False) for n in peer_networks or []]
        self.connect_timeout_s = connect_timeout_s
        self.max_pending = PENDING_PER_CALL * max_calls  # answered offers not yet connected
        self.process_full = process_full  # the process has all the calls (any transport) it may take
        self.peers: dict[str, WebRtcPeer] = {}
        self.media = MediaThread()
        self._answering = 0  # offers being answered: counted against the cap already
        self._runner = None

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=MAX_OFFER_BYTES)
        app.router.add_get("/", lambda r: web.HTTPFound("/call"))
        app.router.add_get("/call", self._page)
        app.router.add_post("/call/offer", self._offer)
        return app

    async def start(self) -> None:
        from aiohttp import web

        self.media.start()
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        log.info("webrtc_listening", url=f"http://{self.host}:{self.port}/call", max_calls=self.max_calls)

    async def stop(self) -> None:
        for peer in list(self.peers.values()):
            await self.hang_up(peer, "agent")
        if self._runner is not None:
            await self._runner.cleanup()
        self.media.stop()

    async def hang_up(self, peer: WebRtcPeer, reason: str) -> None:
        await self.media.run(peer.close(reason))

    async def _page(self, request):
        from aiohttp import web

        html = resources.files("callcenter.telephony").joinpath("call.html").read_text()
        return web.Response(text=html, content_type="text/html")

    async def _offer(self, request):
        from aiohttp import web

        remote = request.remote or ""
        try:
            body = await request.json()
        except (ValueError, RecursionError):
            return web.json_response({"error": "bad_request", "message": "the body must be JSON"}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("sdp"), str):
            return web.json_response({"error": "bad_request", "message": "expected {sdp, type}"}, status=400)
        if body.get("type", "offer") != "offer" or "m=audio" not in body["sdp"]:
            return web.json_response({"error": "bad_offer", "message": "expected an SDP offer with an audio stream"},
                                     status=400)
        # one connecting offer per address: a new one replaces it (a page reloaded, or somebody
        # holding slots with offers that never connect)
        for peer in [p for p in self.peers.values() if p.remote == remote and not p.connected]:
            await self._drop(peer, "replaced by a newer offer from the same address")
        # an offer holds no call slot until it connects (ICE + DTLS): offers that never connect
        # cannot keep real callers out. They wait in a pool of their own; when it is full, the
        # oldest is dropped.
        pending = sorted((p for p in self.peers.values() if not p.connected), key=lambda p: p.answered_at)
        if len(pending) + self._answering >= self.max_pending and pending:
            await self._drop(pending[0], "not connected; its place given to a newer offer")
        if self.connected_calls + self._answering >= self.max_calls or self.process_full():
            self.rejected["max_calls"] += 1
            log.warning("webrtc_busy", remote=remote, calls=len(self.peers), max_calls=self.max_calls)
            return web.json_response({"error": "busy", "message": BUSY_MESSAGE}, status=503,
                                     headers={"Retry-After": "60"})
        sdp, dropped = keep_candidates(body["sdp"], self._reachable(remote))
        if dropped:
            log.warning("webrtc_candidates_dropped", remote=remote, addresses=dropped[:8])
        self._answering += 1  # two offers at once cannot both pass the cap
        try:
            peer, answer = await self.media.run(self._answer(sdp, str(body.get("type", "offer")), remote))
        except WebRtcError as exc:
            log.warning("webrtc_offer_refused", remote=remote, error=str(exc))
            return web.json_response({"error": "bad_offer", "message": str(exc)}, status=400)
        finally:
            self._answering -= 1
        self.peers[peer.call_id] = peer
        self.on_call(peer, remote)
        return web.json_response({"sdp": answer, "type": "answer", "call_id": peer.call_id,
                                  "codec": peer.codec[0]})

    @property
    def connected_calls(self) -> int:
        return sum(1 for p in self.peers.values() if p.connected)

    def _reachable(self, remote: str) -> Callable[[str], bool]:
        """Which addresses the agent may send media (and STUN) to for a browser at `remote`."""
        import ipaddress

        own = own_addresses()

        def may_reach(address: str) -> bool:
            if address == remote:
                return True
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                return False
            return ip in own or any(ip in net for net in self.peer_networks)

        return may_reach

    async def _drop(self, peer: WebRtcPeer, why: str) -> None:
        log.warning("webrtc_offer_dropped", call_id=peer.call_id, remote=peer.remote, reason=why)
        self.peers.pop(peer.call_id, None)
        await self.hang_up(peer, "agent")

    async def _answer(self, sdp: str, kind: str, remote: str) -> tuple[WebRtcPeer, str]:
        """On the media loop: a new peer and its answer."""
        peer = WebRtcPeer(self.stun_servers, self.connect_timeout_s)
        peer.remote = remote
        return peer, await peer.answer(sdp, kind)

    def ended(self, call_id: str) -> None:
        self.peers.pop(call_id, None)
