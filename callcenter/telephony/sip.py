"""SIP lines through pjsua2.

pjsua2 runs on one dedicated thread (`SipEndpoint`): it owns the library, polls its events and runs
every command the asyncio side submits, so no other thread ever calls into pjsua2. Media callbacks
come on pjmedia's clock thread and touch only the call's `MediaBridge`.

Facts of the pjsua2-python 2.15.1 wheel this relies on: PCMU/PCMA/G722 only; at most 4 calls per
process (a 5th INVITE is answered 486 Busy Here); reading a frame's vector through `bytes()` costs
~0.5 ms, so frames are copied straight from the vector's memory.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import ctypes
import ipaddress
import os
import queue
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import pjsua2 as pj
import structlog

from callcenter.audio.frames import FRAME_MS, SAMPLE_RATE
from callcenter.errors import CallcenterError
from callcenter.telephony.config import ServerConfig
from callcenter.telephony.kamailio import AGENT_HEADER

log = structlog.get_logger()

POLL_MS = 5
PORT_REST_S = 2.0  # a finished call's conference port rests this long before the next call gets it
CODEC_IDS = {"PCMU": "PCMU/8000/1", "PCMA": "PCMA/8000/1"}
SIP_BUSY_HERE = 486
SIP_FORBIDDEN = 403
SIP_LOOP_DETECTED = 482  # RFC 3261 8.2.2.2: a request merged with one we already have
SIP_RINGING = 180
SIP_OK = 200
TRANSFER_WAIT_S = 5.0


SUPERVISION_MODES = ("listen", "whisper", "barge")


class SipError(CallcenterError, RuntimeError):
    pass


_PJSIP = None


def _pjsip():
    """pjsip's own C functions that pjsua2 does not wrap, from the extension module's library."""
    global _PJSIP
    if _PJSIP is None:
        lib = ctypes.CDLL(pj._pjsua2.__file__)
        for name in ("pjsip_tsx_get_dlg", "pjsip_dlg_get_inv_session"):
            getattr(lib, name).restype = ctypes.c_void_p
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        lib.pjsip_inv_terminate.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.pjsip_inv_terminate.restype = ctypes.c_int
        _PJSIP = lib
    return _PJSIP


def invite_session_of(tsx) -> int | None:
    """The INVITE session (pjsip_inv_session *) of a call, from one of its transactions
    (pjsua2's SipTransaction), while pjsua holds it."""
    try:
        lib = _pjsip()
        dlg = lib.pjsip_tsx_get_dlg(int(tsx.pjTransaction))
        return lib.pjsip_dlg_get_inv_session(dlg) if dlg else None
    except (AttributeError, OSError, TypeError, ValueError):
        return None


# Where pjsip keeps a received request's raw text and its source address inside pjsip_rx_data
# (pjsip 2.15, x86-64, PJSIP_MAX_PKT_LEN 4000, as in the pjsua2-python wheel; measured, and checked
# on every request: a layout that does not match turns the filter off instead of misreading memory).
RDATA_PACKET = 320
RDATA_SRC_FAMILY = 4336
RDATA_SRC_NAME = 4368
ADDRESS_FAMILIES = (2, 10)  # AF_INET, AF_INET6
FILTER_PRIORITY = 10  # after the transport layer (8), ahead of transactions (16) and pjsua's own modules
_ON_RX_REQUEST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class _PjsipModule(ctypes.Structure):
    _fields_ = [("prev", ctypes.c_void_p), ("next", ctypes.c_void_p), ("name", ctypes.c_char_p),
                ("name_len", ctypes.c_ssize_t), ("id", ctypes.c_int), ("priority", ctypes.c_int),
                ("load", ctypes.c_void_p), ("start", ctypes.c_void_p), ("stop", ctypes.c_void_p),
                ("unload", ctypes.c_void_p), ("on_rx_request", _ON_RX_REQUEST), ("on_rx_response", ctypes.c_void_p),
                ("on_tx_request", ctypes.c_void_p), ("on_tx_response", ctypes.c_void_p),
                ("on_tsx_state", ctypes.c_void_p)]


PJSUA_BUSY_LINE = "too many calls"  # pjsua's own 486 at its compiled call limit says only this (level 2)


class PjsipLog(pj.LogWriter):
    """pjsip's log lines (errors and warnings: level 1-2) as structured `pjsip` events. pjsua turns
    away a call over its compiled limit before we hear of it; its warning is counted (`on_busy`)."""

    def __init__(self, on_busy=None):
        super().__init__()
        self.on_busy = on_busy

    def write(self, entry: "pj.LogEntry") -> None:
        try:
            text = entry.msg.strip()
            if PJSUA_BUSY_LINE in text and self.on_busy is not None:
                self.on_busy()
            if text:
                (log.error if entry.level <= 1 else log.warning if entry.level == 2 else log.debug)(
                    "pjsip", pj_level=entry.level, message=text)
        except Exception:  # never raise into pjsip's C stack
            pass


class AclFilter:
    """The ACL for every request, not only INVITE: pjsua answers OPTIONS and MESSAGE with 200 by
    itself, whoever sends them. A pjsip module ahead of pjsua's answers requests from outside the
    ACL with 403 (an ACK is dropped). INVITEs pass on to `SipEndpoint._incoming`, which refuses and
    logs them itself."""

    NAME = b"mod-callcenter-acl"

    def __init__(self, allows: Callable[[str], bool]):
        self.allows = allows
        self.enabled = True
        lib = _pjsip()
        lib.pjsua_get_pjsip_endpt.restype = ctypes.c_void_p
        lib.pjsip_endpt_register_module.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.pjsip_endpt_respond_stateless.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._lib = lib
        self._endpt = lib.pjsua_get_pjsip_endpt()
        self._callback = _ON_RX_REQUEST(self._on_rx_request)  # kept: pjsip holds only the pointer
        self.module = _PjsipModule(name=self.NAME, name_len=len(self.NAME), id=-1, priority=FILTER_PRIORITY,
                                   on_rx_request=self._callback)
        status = lib.pjsip_endpt_register_module(self._endpt, ctypes.byref(self.module))
        if status != 0:
            raise SipError(f"cannot install the ACL filter (pjsip status {status})")

    def _on_rx_request(self, rdata: int) -> int:
        if not self.enabled:
            return 0
        try:
            family = ctypes.c_uint16.from_address(rdata + RDATA_SRC_FAMILY).value
            name = ctypes.string_at(rdata + RDATA_SRC_NAME, 46).split(b"\0", 1)[0].decode("ascii")
            method = ctypes.string_at(rdata + RDATA_PACKET, 24).split(b" ", 1)[0]
            if family not in ADDRESS_FAMILIES or not method.isalpha() or not method.isupper():
                raise ValueError(f"unexpected pjsip_rx_data layout (family {family}, method {method[:16]!r})")
            ipaddress.ip_address(name)
        except (ValueError, UnicodeDecodeError) as exc:
            self.enabled = False
            log.error("acl_filter_disabled", error=str(exc))
            return 0
        if method == b"INVITE" or self.allows(f"{name}:0" if ":" not in name else f"[{name}]:0"):
            return 0
        if method != b"ACK":
            self._lib.pjsip_endpt_respond_stateless(self._endpt, rdata, SIP_FORBIDDEN, None, None, None)
        log.warning("sip_request_rejected", reason="acl", method=method.decode(), source=name)
        return 1


def _vector_address(vec) -> int:
    """Address of the first element of a SWIG std::vector<unsigned char>."""
    return ctypes.c_void_p.from_address(int(vec.this)).value or 0


def read_frame(frame: "pj.MediaFrame") -> bytes:
    size = frame.size
    if size <= 0:
        return b""
    buf = frame.buf
    return ctypes.string_at(_vector_address(buf), min(size, buf.size()))


def write_frame(frame: "pj.MediaFrame", pcm: bytes) -> None:
    buf = frame.buf
    if buf.size() != len(pcm):
        buf.resize(len(pcm))
    ctypes.memmove(_vector_address(buf), pcm, len(pcm))
    frame.size = len(pcm)
    frame.type = pj.PJMEDIA_FRAME_TYPE_AUDIO


class _BridgePort(pj.AudioMediaPort):
    """pjmedia conference port that hands frames to and from a call's MediaBridge. Ports are
    pooled by the endpoint and never destroyed while it runs (see `SipEndpoint.take_port`)."""

    def __init__(self) -> None:
        super().__init__()
        self.bridge = None
        self.closed = True  # no call: callbacks still in flight from the last one do nothing

    def onFrameRequested(self, frame):  # noqa: N802 (pjsua2 name)
        bridge = self.bridge
        if self.closed or bridge is None:
            return
        try:
            write_frame(frame, bridge.agent_frame())
        except Exception:  # never let an exception cross into pjmedia's clock thread
            log.exception("media_out_failed")

    def onFrameReceived(self, frame):  # noqa: N802
        bridge = self.bridge
        if self.closed or bridge is None:
            return
        try:
            if frame.type == pj.PJMEDIA_FRAME_TYPE_AUDIO:
                bridge.caller_frame(read_frame(frame))
        except Exception:
            log.exception("media_in_failed")




@dataclass
class CallInfo:
    call_id: str  # the SIP Call-ID
    remote_uri: str
    local_uri: str
    agent: str | None = None  # the human agent Kamailio authenticated (a keypad code call)
    request_uri: str = ""  # the INVITE's Request-URI: what the caller dialled

    @property
    def dialled(self) -> str:
        """The user part of the number dialled, from the Request-URI (never the To header, which
        the caller writes and Kamailio does not check), e.g. `*45`."""
        return uri_user(self.request_uri)


@contextlib.contextmanager
def _stdout_to_devnull():
    """Hold the process's standard output (file descriptor 1) on /dev/null for a moment."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def uri_user(uri: str) -> str:
    """`sip:*45@10.0.0.1;transport=udp` → `*45`; `<sip:bob@host>` → `bob`; no user part → ``."""
    uri = uri.split("<")[-1].split(">")[0].strip()
    rest = uri.split(":", 1)[-1]
    return rest.split("@", 1)[0] if "@" in rest else ""


def _head_lines(message: str) -> list[str]:
    """The start line and header fields of a SIP message, with folded continuation lines (a line
    that begins with a space or tab, RFC 3261 7.3.1) joined to the field they continue."""
    head = re.split(r"\r?\n\r?\n", message, maxsplit=1)[0]
    lines: list[str] = []
    for line in re.split(r"\r?\n", head):
        if line[:1] in (" ", "\t") and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def headers_of(message: str, name: str) -> list[str]:
    """Every value of header `name` (case-insensitive, folded lines unfolded)."""
    out = []
    for line in _head_lines(message)[1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == name.lower():
            out.append(value.strip())
    return out


def header_of(message: str, name: str) -> str | None:
    """The value of header `name` if the message has it exactly once (a second copy is refused: only
    one party can have written both, and it is not to be trusted), else None."""
    values = headers_of(message, name)
    return values[0] if len(values) == 1 else None


def request_uri_of(message: str) -> str:
    """The Request-URI of a request's start line (`INVITE sip:*45@host SIP/2.0`)."""
    parts = _head_lines(message)[0].split()
    return parts[1] if len(parts) == 3 else ""


class SipCall(pj.Call):
    """One SIP dialog; lives on the SIP thread. Reports to `listener` on the asyncio loop."""

    def __init__(self, endpoint: "SipEndpoint", account, call_index: int = pj.PJSUA_INVALID_ID):
        super().__init__(account, call_index)
        self.endpoint = endpoint
        self.listener = None  # set by the server: on_confirmed, on_media, on_disconnected, on_dtmf, on_transfer_status
        self.bridge = None
        self.port: _BridgePort | None = None
        self.info: CallInfo | None = None
        self.confirmed = False
        self.disconnected = False
        self.invite_session: int | None = None  # pjsip's INVITE session, for terminate_unanswered()

    def _notify(self, name: str, *args) -> None:
        if self.listener is not None:
            fn = getattr(self.listener, name, None)
            if fn is not None:
                self.endpoint.post(fn, *args)

    def onCallState(self, prm):  # noqa: N802
        ci = self.getInfo()
        if ci.state == pj.PJSIP_INV_STATE_CONNECTING and self.invite_session is None \
                and prm.e.type == pj.PJSIP_EVENT_TSX_STATE:  # our 200 OK is out: ACK awaited
            self.invite_session = invite_session_of(prm.e.body.tsxState.tsx)
        if ci.state == pj.PJSIP_INV_STATE_CONFIRMED and not self.confirmed:
            self.confirmed = True
            self.invite_session = None
            self._notify("on_confirmed")
        elif ci.state == pj.PJSIP_INV_STATE_DISCONNECTED and not self.disconnected:
            self.disconnected = True
            self.invite_session = None
            # pjsua frees this call's slot now and gives it to the next call. The C++ Call
            # destructor, run whenever Python drops this object, clears the user data of its slot
            # number — by then the *next* call's — and that call loses its callbacks (no BYE
            # reported) and its media: the soak's frozen calls. Python must never run it.
            self.thisown = False
            self._disconnect_media()
            self._notify("on_disconnected", ci.lastStatusCode, ci.lastReason)
            self.endpoint.forget(self)

    def onCallMediaState(self, prm):  # noqa: N802
        ci = self.getInfo()
        for i, media in enumerate(ci.media):
            if media.type == pj.PJMEDIA_TYPE_AUDIO and media.status == pj.PJSUA_CALL_MEDIA_ACTIVE:
                if self.port is None and self.bridge is not None:
                    self._connect_media(self.getAudioMedia(i))

    def _connect_media(self, audio) -> None:
        port = self.endpoint.take_port(self.bridge)
        audio.startTransmit(port)
        port.startTransmit(audio)
        self.port = port
        self._notify("on_media")

    def _disconnect_media(self) -> None:
        """The call is gone: its port goes quiet now and back to the endpoint's pool."""
        if self.port is not None:
            self.endpoint.return_port(self.port)
            self.port = None

    def onDtmfDigit(self, prm):  # noqa: N802
        self._notify("on_dtmf", prm.digit)

    def onCallTransferStatus(self, prm):  # noqa: N802
        self._notify("on_transfer_status", prm.statusCode, prm.reason, prm.finalNotify)

    # ---- commands, run on the SIP thread through SipEndpoint.call_soon
    def answer_with(self, code: int, reason: str = "") -> None:
        op = pj.CallOpParam(True)
        op.statusCode = code
        if reason:
            op.reason = reason
        self.answer(op)

    def hangup_now(self) -> None:
        if self.disconnected:
            return
        op = pj.CallOpParam(True)
        self.hangup(op)

    def terminate_unanswered(self) -> None:
        """Our 200 OK was never ACKed. A hang-up cannot send BYE before the ACK, and pjsua keeps the
        call slot until the transaction times out (64 s): end the INVITE session at once instead."""
        if self.disconnected or self.confirmed:
            return
        if self.invite_session:
            _pjsip().pjsip_inv_terminate(self.invite_session, 408, 1)
        if not self.disconnected:
            self.hangup_now()

    def refer(self, uri: str) -> None:
        self.xfer(uri, pj.CallOpParam(True))

    def supervise(self, supervisor: "SipCall", mode: str, person: "SipCall | None", ai_voice: bool,
                  private: bool = False) -> None:
        """Join a supervisor's call to this one in pjmedia's conference bridge (SIP thread); called
        again to switch modes, each switch one set of port connections (instant). `listen`: the
        supervisor hears the caller, the agent's voice (`ai_voice`) and the person bridged to the
        caller (`person`), and nobody hears them. `whisper`: the person hears them too (an AI agent
        hears them through the supervisor leg's own recognizer instead). `barge`: the caller too.
        `private`: a card number is being given or read back: the supervisor hears neither the caller
        nor the agent's voice until it is over (they may still speak, as their mode allows)."""
        if mode not in SUPERVISION_MODES:
            raise SipError(f"unknown supervision mode {mode!r}")
        caller, sup = self.getAudioMedia(-1), supervisor.getAudioMedia(-1)
        theirs = person.getAudioMedia(-1) if person is not None and not person.disconnected else None
        for media in (caller, theirs):
            if media is not None:
                media.stopTransmit(sup)
                sup.stopTransmit(media)
        if self.port is not None:
            self.port.stopTransmit(sup)
        if not private:
            caller.startTransmit(sup)
        if theirs is not None:
            theirs.startTransmit(sup)
        if ai_voice and self.port is not None and not private:
            self.port.startTransmit(sup)
        if mode in ("whisper", "barge") and theirs is not None:
            sup.startTransmit(theirs)
        if mode == "barge":
            sup.startTransmit(caller)

    def bridge_to(self, other: "SipCall") -> None:
        """Connect this call's audio with another call's, both ways, in pjmedia's conference bridge;
        the agent's own voice stops going to either side. Our ports keep receiving, so both
        recordings go on."""
        mine, theirs = self.getAudioMedia(-1), other.getAudioMedia(-1)
        mine.startTransmit(theirs)
        theirs.startTransmit(mine)
        for call, media in ((self, mine), (other, theirs)):
            if call.port is not None:
                call.port.stopTransmit(media)


class _Account(pj.Account):
    def __init__(self, endpoint: "SipEndpoint"):
        super().__init__()
        self.endpoint = endpoint

    def onIncomingCall(self, prm):  # noqa: N802
        self.endpoint._incoming(self, prm)

    def onRegState(self, prm):  # noqa: N802
        log.info("sip_registration", code=prm.code, reason=prm.reason, expiration=prm.expiration)


class SipEndpoint:
    """Owns pjsua2 on one thread. `on_incoming(call, info)` is called on the asyncio loop for each
    new call that fits under max_calls; the callee decides by calling `answer()`."""

    def __init__(self, config: ServerConfig, loop: asyncio.AbstractEventLoop,
                 on_incoming: Callable[[SipCall, CallInfo], None], other_calls: Callable[[], int] = lambda: 0):
        self.config = config
        self.loop = loop
        self.on_incoming = on_incoming
        self.other_calls = other_calls  # the process's calls on other transports: one cap for all
        self._commands: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._start_error: BaseException | None = None
        self.calls: dict[str, SipCall] = {}
        self._graveyard: list[SipCall] = []
        self._resting_ports: list[tuple[float, _BridgePort]] = []
        self._free_ports: list[_BridgePort] = []
        self.ports_created = 0
        self.rejected: collections.Counter[str] = collections.Counter()  # calls refused, by reason
        self.acl_filter: AclFilter | None = None

    # ---------------------------------------------------------------- threads
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pjsua2", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._start_error:
            raise self._start_error

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)

    def post(self, fn, *args) -> None:
        """Run fn(*args) on the asyncio loop (from the SIP thread)."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # loop closed during shutdown

    def call_soon(self, fn, *args) -> concurrent.futures.Future:
        """Run fn(*args) on the SIP thread; returns a future for its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put((fn, args, fut))
        return fut

    async def run_on_sip(self, fn, *args):
        return await asyncio.wrap_future(self.call_soon(fn, *args))

    def _run(self) -> None:
        ep = pj.Endpoint()
        self.ep = ep
        try:
            self._init(ep)
        except BaseException as exc:  # report to start() instead of dying silently
            self._start_error = exc
            self._ready.set()
            try:
                ep.libDestroy()
            except Exception:
                pass
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                ep.libHandleEvents(POLL_MS)
                self._drain_commands()
                self._graveyard.clear()
                while self._resting_ports and self._resting_ports[0][0] <= time.monotonic():
                    self._free_ports.append(self._resting_ports.pop(0)[1])
        finally:
            self._shutdown(ep)

    def _drain_commands(self) -> None:
        while True:
            try:
                fn, args, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:
                    fut.set_exception(_as_sip_error(exc))

    def _init(self, ep: "pj.Endpoint") -> None:
        cfg = self.config
        with _stdout_to_devnull():  # pjlib prints its start-up lines before our log writer is set
            ep.libCreate()
        ep_cfg = pj.EpConfig()
        ep_cfg.uaConfig.threadCnt = 0
        ep_cfg.uaConfig.mainThreadOnly = True
        ep_cfg.uaConfig.maxCalls = cfg.max_calls
        ep_cfg.uaConfig.userAgent = "callcenter"
        ep_cfg.logConfig.level = 2
        ep_cfg.logConfig.consoleLevel = 2
        # pjsip's own lines go through structlog as JSON, not as plain text into the JSON log
        self._log_writer = PjsipLog(on_busy=self._busy_at_pjsua)
        ep_cfg.logConfig.writer = self._log_writer
        ep_cfg.logConfig.decor = pj.PJ_LOG_HAS_SENDER
        ep_cfg.medConfig.clockRate = SAMPLE_RATE
        ep_cfg.medConfig.sndClockRate = SAMPLE_RATE
        ep_cfg.medConfig.channelCount = 1
        ep_cfg.medConfig.audioFramePtime = FRAME_MS
        ep_cfg.medConfig.noVad = True
        ep_cfg.medConfig.ecTailLen = 0
        ep.libInit(ep_cfg)
        if cfg.acl:
            self.acl_filter = AclFilter(cfg.allows)
        tcfg = pj.TransportConfig()
        tcfg.port = cfg.listen.port
        tcfg.boundAddress = cfg.listen.host
        try:
            ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, tcfg)
        except pj.Error as exc:
            raise SipError(
                f"cannot listen for SIP on udp {cfg.listen.host}:{cfg.listen.port}: {exc.reason.strip()} "
                "(is another agent or softphone using that port?)"
            ) from None
        ep.libStart()
        ep.audDevManager().setNullDev()
        for codec in ep.codecEnum2():
            ep.codecSetPriority(codec.codecId, 0)
        for prio, name in zip(range(255, 0, -1), cfg.codecs):
            ep.codecSetPriority(CODEC_IDS[name], prio)
        acfg = pj.AccountConfig()
        host = cfg.listen.host if cfg.listen.host not in ("0.0.0.0", "::") else "127.0.0.1"
        acfg.idUri = f"sip:{cfg.agent_user}@{host}:{cfg.listen.port}"
        acfg.mediaConfig.transportConfig.port = cfg.rtp_port
        acfg.mediaConfig.transportConfig.portRange = 1000
        if cfg.listen.host not in ("0.0.0.0", "::"):
            acfg.mediaConfig.transportConfig.boundAddress = cfg.listen.host
        if cfg.registration:
            reg = cfg.registration
            domain = reg.domain or reg.registrar.split(":", 1)[1]
            acfg.idUri = f"sip:{reg.user}@{domain}"
            acfg.regConfig.registrarUri = reg.registrar
            acfg.regConfig.timeoutSec = reg.expires_s
            acfg.sipConfig.authCreds.append(pj.AuthCredInfo("digest", reg.realm, reg.user, 0, reg.secret()))
        self.account = _Account(self)
        self.account.create(acfg, True)
        log.info("sip_listening", address=f"udp:{cfg.listen.host}:{cfg.listen.port}", uri=acfg.idUri,
                 max_calls=cfg.max_calls, codecs=cfg.codecs)

    def _shutdown(self, ep) -> None:
        for call in list(self.calls.values()):
            try:
                call.hangup_now()
            except Exception:
                pass
        deadline = time.monotonic() + 1.0
        while self.calls and time.monotonic() < deadline:
            ep.libHandleEvents(POLL_MS)
        for call in list(self.calls.values()):
            call.port = None
        self.calls.clear()
        self._graveyard.clear()
        self._resting_ports.clear()  # idle ports, connected to nothing: safe to free now
        self._free_ports.clear()
        try:
            self.account.shutdown()
        except Exception:
            pass
        self.account = None
        ep.libDestroy()

    def _busy_at_pjsua(self) -> None:
        self.rejected["max_calls"] += 1
        log.warning("sip_call_rejected", reason="max_calls", max_calls=self.config.max_calls, by="pjsua")

    # ---------------------------------------------------------------- calls (SIP thread)
    def _incoming(self, account, prm) -> None:
        call = SipCall(self, account, prm.callId)
        try:
            ci = call.getInfo()
            source = prm.rdata.srcAddress
            message = prm.rdata.wholeMsg
            # only the balancer (judged by the packet's source address, not by anything the message
            # says of itself) may name the agent who dialled a keypad code
            trusted = self.config.trusts_proxy(source)
            info = CallInfo(ci.callIdString, ci.remoteUri, ci.localUri,
                            header_of(message, AGENT_HEADER) if trusted else None, request_uri_of(message))
            if not trusted and headers_of(message, AGENT_HEADER):
                log.warning("sip_agent_header_ignored", source=source, remote=info.remote_uri,
                            why="not from a trusted proxy")
            call.info = info
            if not self.config.allows(source):
                self.rejected["acl"] += 1
                log.warning("sip_call_rejected", reason="acl", source=source, remote=info.remote_uri)
                call.answer_with(SIP_FORBIDDEN, "Not allowed from this address")
                self._graveyard.append(call)
                return
            live = self.calls.get(info.call_id)
            if live is not None and not live.disconnected:  # two dialogs, one recording: refused
                self.rejected["call_id_in_use"] += 1
                log.warning("sip_call_rejected", reason="call_id_in_use", remote=info.remote_uri)
                call.answer_with(SIP_LOOP_DETECTED, "Call-ID already in use")
                self._graveyard.append(call)
                return
            active = sum(1 for c in self.calls.values() if not c.disconnected) + self.other_calls()
            if active >= self.config.max_calls:
                self.rejected["max_calls"] += 1
                log.warning("sip_call_rejected", reason="max_calls", max_calls=self.config.max_calls,
                            remote=info.remote_uri)
                call.answer_with(SIP_BUSY_HERE, "Too many calls")
                self._graveyard.append(call)
                return
            self.calls[info.call_id] = call
            call.answer_with(SIP_RINGING)
            self.post(self.on_incoming, call, info)
        except pj.Error as exc:
            log.error("sip_incoming_failed", error=exc.info())
            self._graveyard.append(call)

    def free_slots(self) -> int:
        """Calls this process may still place or take: max_calls less the live SIP dialogs and the
        connected calls of other transports (any thread: a snapshot of the dialogs)."""
        active = sum(1 for c in list(self.calls.values()) if not c.disconnected) + self.other_calls()
        return max(0, self.config.max_calls - active)

    def make_call(self, uri: str, listener, bridge, headers: dict[str, str] | None = None) -> SipCall:
        """Place an outgoing call (SIP thread), e.g. to a person for a warm transfer, with extra
        `headers` in its INVITE (a caller ID). It counts toward max_calls like any other call."""
        if not self.free_slots():
            raise SipError(f"cannot call {uri}: all {self.config.max_calls} call slots are in use")
        call = SipCall(self, self.account)
        call.listener = listener
        call.bridge = bridge
        op = pj.CallOpParam(True)
        for name, value in (headers or {}).items():
            header = pj.SipHeader()
            header.hName, header.hValue = name, value
            op.txOption.headers.append(header)
        try:
            call.makeCall(uri, op)
        except pj.Error as exc:
            raise SipError(f"cannot call {uri}: {exc.reason.strip()}") from None
        ci = call.getInfo()
        call.info = CallInfo(ci.callIdString, uri, ci.localUri)
        self.calls[call.info.call_id] = call
        log.info("sip_call_out", to=uri, sip_call_id=call.info.call_id)
        return call

    def take_port(self, bridge) -> _BridgePort:
        """A conference port for a call's media (on the SIP thread). Ports are reused, never freed
        while the endpoint runs: pjmedia's clock thread may be inside a port's callback when its
        call ends (a BYE races the 20 ms tick), and a port freed then first froze the endpoint and,
        when freed two seconds later instead, still crashed it now and then (a callback reaching the
        half-destroyed Python object, then freed memory: a soak at 12 calls lost 3 workers in 14
        min). So there are at most as many ports as calls ever were at once, plus those resting."""
        if self._free_ports:
            port = self._free_ports.pop()
        else:
            fmt = pj.MediaFormatAudio()
            fmt.init(pj.PJMEDIA_FORMAT_PCM, SAMPLE_RATE, 1, FRAME_MS * 1000, 16)
            port = _BridgePort()
            port.createPort(f"bridge-{self.ports_created}", fmt)
            self.ports_created += 1
            log.info("conference_port_created", ports=self.ports_created)
        port.bridge = bridge
        port.closed = False
        return port

    def return_port(self, port: _BridgePort) -> None:
        """Its call is over: quiet now, and handed to another call only after PORT_REST_S, when any
        callback of the old call has long returned and the call's stream is out of the conference."""
        port.closed = True
        port.bridge = None
        self._resting_ports.append((time.monotonic() + PORT_REST_S, port))

    def forget(self, call: SipCall) -> None:
        if call.info:
            self.calls.pop(call.info.call_id, None)
        self._graveyard.append(call)


def _as_sip_error(exc: BaseException) -> BaseException:
    if isinstance(exc, pj.Error):
        return SipError(f"{exc.title}: {exc.reason.strip()} (status {exc.status})")
    return exc
