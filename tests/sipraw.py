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
    """A far end on a UDP socket in its own thread. Its `mode` says what it does with an INVITE:
    `busy` refuses with 486; `ring` sends 180 and rings until CANCELled (then 200 for the CANCEL,
    487 for the INVITE); `answer` answers (200 with SDP) and hangs up `hold_s` after the ACK.
    `mode` may also be a function of the INVITE's user part that returns one of these (a trunk
    with many numbers behind it). Every request it got is kept (`requests`)."""

    def __init__(self, mode, ip: str = "127.0.0.1", hold_s: float = 1.5):
        import threading

        self.mode = mode if callable(mode) else (lambda user: mode)
        self.hold_s = hold_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self._invites: dict[str, tuple[bytes, tuple]] = {}
        self._byes: list[tuple[float, bytes, tuple]] = []
        self._tag = uuid.uuid4().hex[:8]
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def uri(self, user: str) -> str:
        return f"sip:{user}@127.0.0.1:{self.port}"

    def invites_to(self, user: str) -> int:
        return sum(1 for r in self.requests if r.startswith(f"INVITE sip:{user}@".encode()))

    def _serve(self) -> None:
        while not self._stop:
            now = time.monotonic()
            for due in [b for b in self._byes if b[0] <= now]:
                self._byes.remove(due)
                self.sock.sendto(due[1], due[2])
            try:
                data, peer = self.sock.recvfrom(65535)
            except (socket.timeout, OSError):
                continue
            if status_of(data) is not None:
                continue
            self.requests.append(data)
            self._on_request(data, peer)

    def _on_request(self, data: bytes, peer) -> None:
        tag = self._tag
        method = data.split(b" ", 1)[0].decode()
        call_id = header(data, "Call-ID")
        if method == "INVITE":
            if call_id in self._invites:  # a retransmission
                return
            self._invites[call_id] = (data, peer)
            self.sock.sendto(response(data, 100, "Trying"), peer)
            user = data.split(b" ", 2)[1].decode().split(":", 1)[1].split("@", 1)[0]
            mode = self.mode(user)
            if mode == "busy":
                self.sock.sendto(response(data, 486, "Busy Here", tag), peer)
            elif mode == "ring":
                self.sock.sendto(response(data, 180, "Ringing", tag), peer)
            else:
                sdp = SDP.format(ip="127.0.0.1", rtp=9)
                ok = response(data, 200, "OK", tag).replace(
                    b"Content-Length: 0", f"Contact: <sip:far@127.0.0.1:{self.port}>\r\nContent-Type: "
                    f"application/sdp\r\nContent-Length: {len(sdp)}".encode()) + sdp.encode()
                self.sock.sendto(ok, peer)
        elif method == "ACK" and call_id in self._invites:
            invite, peer_of = self._invites[call_id]
            target = re.search(r"<([^>]+)>", header(invite, "Contact")).group(1)
            bye = "\r\n".join([
                f"BYE {target} SIP/2.0",
                f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};rport;branch=z9hG4bK{uuid.uuid4().hex[:12]}",
                "Max-Forwards: 70", f"From: {header(invite, 'To')};tag={tag}", f"To: {header(invite, 'From')}",
                f"Call-ID: {call_id}", "CSeq: 1 BYE", "Content-Length: 0"]) + "\r\n\r\n"
            self._byes.append((time.monotonic() + self.hold_s, bye.encode(), peer_of))
        elif method == "CANCEL":
            self.sock.sendto(response(data, 200, "OK", tag), peer)
            if call_id in self._invites:
                self.sock.sendto(response(self._invites[call_id][0], 487, "Request Terminated", tag), peer)
        elif method == "BYE":
            self.sock.sendto(response(data, 200, "OK"), peer)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()
