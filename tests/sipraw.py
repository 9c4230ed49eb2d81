"""A bare SIP user agent on a UDP socket, for tests that must send what no softphone sends: an
INVITE never ACKed, a Call-ID another call already has, forged in-dialog requests. Loopback only."""

from __future__ import annotations

import re
import socket
import time
import uuid

SDP = ("v=0\r\no=- 1 1 IN IP4 {ip}\r\ns=-\r\nc=IN IP4 {ip}\r\nt=0 0\r\n"
       "m=audio {rtp} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n")


def request(method: str, uri: str, local: tuple[str, int], call_id: str, from_tag: str, cseq: int,
            to_tag: str | None = None, extra: str = "", body: str = "") -> bytes:
    ip, port = local
    lines = [
        f"{method} {uri} SIP/2.0",
        f"Via: SIP/2.0/UDP {ip}:{port};rport;branch=z9hG4bK{uuid.uuid4().hex[:12]}",
        "Max-Forwards: 70",
        f"From: <sip:caller@{ip}:{port}>;tag={from_tag}",
        f"To: <{uri}>" + (f";tag={to_tag}" if to_tag else ""),
        f"Call-ID: {call_id}",
        f"CSeq: {cseq} {method}",
        f"Contact: <sip:caller@{ip}:{port}>",
    ]
    lines += [x for x in extra.split("\n") if x]
    if body:
        lines.append("Content-Type: application/sdp" if body.startswith("v=0") else "Content-Type: text/plain")
    lines.append(f"Content-Length: {len(body.encode())}")
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


def status_of(data: bytes) -> int | None:
    m = re.match(rb"SIP/2\.0 (\d{3})", data)
    return int(m.group(1)) if m else None


def header(data: bytes, name: str) -> str:
    m = re.search(rb"(?im)^" + name.encode() + rb"\s*:\s*(.*?)\r?$", data)
    return m.group(1).decode(errors="replace") if m else ""


class RawUac:
    def __init__(self, ip: str = "127.0.0.1"):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, 0))
        self.local = self.sock.getsockname()

    def send(self, data: bytes, to: tuple[str, int]) -> None:
        self.sock.sendto(data, to)

    def final(self, call_id: str, timeout: float = 5.0) -> bytes | None:
        """The first final (>= 200) response for `call_id`, or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                data, _ = self.sock.recvfrom(65535)
            except socket.timeout:
                return None
            code = status_of(data)
            if code and code >= 200 and header(data, "Call-ID") == call_id:
                return data
        return None

    def invite(self, agent: tuple[str, int], call_id: str | None = None, from_tag: str | None = None,
               rtp_port: int = 9) -> tuple[int | None, bytes | None, dict]:
        """INVITE (no ACK yet); returns (final status, response, dialog)."""
        call_id = call_id or f"{uuid.uuid4().hex}@{self.local[0]}"
        from_tag = from_tag or uuid.uuid4().hex[:8]
        uri = f"sip:agent@{agent[0]}:{agent[1]}"
        body = SDP.format(ip=self.local[0], rtp=rtp_port)
        self.send(request("INVITE", uri, self.local, call_id, from_tag, 1, body=body), agent)
        response = self.final(call_id)
        dialog = {"call_id": call_id, "from_tag": from_tag, "uri": uri}
        if response is not None:
            m = re.search(r"tag=([^;>\s]+)", header(response, "To"))
            dialog["to_tag"] = m.group(1) if m else None
        return (status_of(response) if response else None), response, dialog

    def ack(self, agent: tuple[str, int], dialog: dict) -> None:
        self.send(request("ACK", dialog["uri"], self.local, dialog["call_id"], dialog["from_tag"], 1,
                          dialog.get("to_tag")), agent)

    def bye(self, agent: tuple[str, int], dialog: dict) -> int | None:
        self.send(request("BYE", dialog["uri"], self.local, dialog["call_id"], dialog["from_tag"], 2,
                          dialog.get("to_tag")), agent)
        response = self.final(dialog["call_id"], 3.0)
        return status_of(response) if response else None

    def close(self) -> None:
        self.sock.close()


def response(req: bytes, code: int, reason: str, to_tag: str | None = None) -> bytes:
    """A response to `req` that mirrors its Via, From, To (with our tag), Call-ID and CSeq."""
    to = header(req, "To")
    if to_tag and "tag=" not in to:
        to += f";tag={to_tag}"
    lines = [f"SIP/2.0 {code} {reason}", f"Via: {header(req, 'Via')}", f"From: {header(req, 'From')}", f"To: {to}",
             f"Call-ID: {header(req, 'Call-ID')}", f"CSeq: {header(req, 'CSeq')}", "Content-Length: 0"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class RawUas:
    """A phone that never answers, on a UDP socket in its own thread: `busy` refuses every INVITE
    with 486; `ring` sends 180 and rings until CANCELled (then 200 for the CANCEL, 487 for the
    INVITE), as an unanswered phone does. Every request it got is kept (`requests`)."""

    def __init__(self, mode: str, ip: str = "127.0.0.1"):
        import threading

        assert mode in ("busy", "ring")
        self.mode = mode
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self._invites: dict[str, bytes] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def uri(self, user: str) -> str:
        return f"sip:{user}@127.0.0.1:{self.port}"

    def _serve(self) -> None:
        tag = uuid.uuid4().hex[:8]
        while not self._stop:
            try:
                data, peer = self.sock.recvfrom(65535)
            except (socket.timeout, OSError):
                continue
            if status_of(data) is not None:
                continue
            self.requests.append(data)
            method = data.split(b" ", 1)[0].decode()
            call_id = header(data, "Call-ID")
            if method == "INVITE":
                self._invites[call_id] = data
                self.sock.sendto(response(data, 100, "Trying"), peer)
                if self.mode == "busy":
                    self.sock.sendto(response(data, 486, "Busy Here", tag), peer)
                else:
                    self.sock.sendto(response(data, 180, "Ringing", tag), peer)
            elif method == "CANCEL":
                self.sock.sendto(response(data, 200, "OK", tag), peer)
                if call_id in self._invites:
                    self.sock.sendto(response(self._invites.pop(call_id), 487, "Request Terminated", tag), peer)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()
