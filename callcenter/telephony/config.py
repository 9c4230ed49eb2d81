"""SIP configuration (`sip_configs/*.yaml`) as typed models."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from callcenter.memory import MALLOC_ARENAS, PROMPT_CACHE_MB, TRIM_EVERY_S
from callcenter.store.url import DEFAULT_STORE_FILE, StoreUrl, StoreUrlError
from callcenter.yamlfile import load_model

PJSUA_MAX_CALLS = 4  # compiled into the pjsua2-python wheel: a 5th call is rejected with 486


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(5062, ge=1, le=65535)
    transport: Literal["udp"] = "udp"

    @field_validator("host")
    @classmethod
    def _ip(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"host must be an IP address, got {v!r}") from None
        return v


class Registration(_Strict):
    registrar: str = Field(description="e.g. sip:pbx.example.com")
    user: str
    domain: str | None = None
    realm: str = "*"
    password: str | None = None
    password_env: str | None = Field(None, description="read the password from this environment variable")
    expires_s: int = Field(300, ge=30, le=86400)

    @model_validator(mode="after")
    def _one_password(self) -> "Registration":
        if (self.password is None) == (self.password_env is None):
            raise ValueError("give exactly one of password or password_env")
        return self

    def secret(self) -> str:
        if self.password is not None:
            return self.password
        value = os.environ.get(self.password_env or "")
        if value is None:
            raise ValueError(f"environment variable {self.password_env} (registration password) is not set")
        return value


def networks(v: list[str]) -> list[str]:
    """Check a list of addresses or networks (CIDR)."""
    for net in v:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ValueError(f"{net!r} is not an address or network (10.0.0.0/8, 192.0.2.7)") from None
    return v


class Control(_Strict):
    """The supervisor's control and event API (HTTP + WebSocket) on the agent server."""
    host: str = Field("127.0.0.1", description="bind address; loopback by default")
    port: int = Field(8470, ge=0, le=65535, description="0: pick a free port (written to the log)")
    token_env: str = Field("CALLCENTER_TOKEN", description="environment variable holding the API token; "
                                                            "when it is unset, a random token is written to "
                                                            "<recordings>/.control-token (mode 600)")
    allowed_origins: list[str] = Field(default_factory=list,
                                       description="web pages (https://console.example.com) whose scripts may "
                                                   "open the event WebSocket; a browser's request from any other "
                                                   "Origin is refused. Tools that send no Origin are not affected.")

    supervisor_phone: str | None = Field(None, description="the SIP URI called for listen / whisper / barge "
                                                           "when the console names no phone")

    _ip = field_validator("host")(Listen._ip.__func__)


class WebRtc(_Strict):
    """Browser callers: the /call page and its WebRTC offer/answer endpoint."""
    host: str = Field("127.0.0.1", description="bind address of the page's HTTP server")
    port: int = Field(8480, ge=0, le=65535, description="0: pick a free port (written to the log)")
    max_calls: int = Field(2, ge=1, le=64, description="browser calls at once; more get a busy message, as do "
                                                       "browser calls while the process has max_calls calls of "
                                                       "any kind (bench webrtc on 2 cores: 2 calls keep their "
                                                       "20 ms clock, 3 do not reliably)")
    candidates: list[str] = Field(default_factory=list,
                                  description="addresses offered for media (ICE host candidates); empty: "
                                              "every interface's address except loopback")
    stun_servers: list[str] = Field(default_factory=list, description="e.g. stun:stun.example.com:3478")
    peer_networks: list[str] = Field(default_factory=list,
                                     description="networks (CIDR) a browser's media may come from besides the "
                                                 "address that sent the offer (browsers behind a proxy or NAT). "
                                                 "Candidates elsewhere are dropped: an offer cannot make the agent "
                                                 "send STUN to an address of the offerer's choosing.")
    connect_timeout_s: float = Field(8.0, gt=0, le=60,
                                     description="an answered offer that has not connected (ICE + DTLS) by then is "
                                                 "dropped, and its call slot freed")

    _ip = field_validator("host")(Listen._ip.__func__)

    @field_validator("candidates")
    @classmethod
    def _addresses(cls, v: list[str]) -> list[str]:
        for a in v:
            Listen._ip.__func__(cls, a)
        return v

    @field_validator("peer_networks")
    @classmethod
    def _peer_networks(cls, v: list[str]) -> list[str]:
        return networks(v)


AGENT_NAME = r"^[A-Za-z0-9._+-]{1,64}$"


class HumanAgent(_Strict):
    """A person who takes calls from queues, on a SIP phone."""
    name: str = Field(pattern=AGENT_NAME, description="how queues name them; also their SIP user at the registrar")
    uri: str | None = Field(None, description="a fixed SIP URI to ring (a desk phone, a PBX extension); absent: "
                                              "sip:<name>@<registrar>, where their softphone registers")
    skills: list[str] = Field(default_factory=list, description="queues with one of these skills ring them")
    logged_in: bool = Field(True, description="logged in when first seen (later their own login/logout holds)")

    @field_validator("uri")
    @classmethod
    def _sip(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("sip:", "sips:")):
            raise ValueError(f"uri must be a SIP URI (sip:alice@192.0.2.10:5060), got {v!r}")
        return v


class ContactCenter(_Strict):
    """Queues of human agents, shared by every worker (flows name the queues; see QueueSettings)."""
    store: Path | None = Field(None, description="deprecated: the top-level `store:` replaces it (this path, if "
                                                 "given and `store:` is not, is read as an SQLite store)")
    registrar: str | None = Field(None, description="host:port where agents' softphones register (the "
                                                    "project's Kamailio); agents without a uri are rung there")
    agents: list[HumanAgent] = Field(default_factory=list)

    @model_validator(mode="after")
    def _reachable(self) -> "ContactCenter":
        names = [a.name for a in self.agents]
        if len(set(names)) != len(names):
            raise ValueError(f"agent names must be unique: {sorted(n for n in set(names) if names.count(n) > 1)}")
        lost = [a.name for a in self.agents if a.uri is None and self.registrar is None]
        if lost:
            raise ValueError(f"agents {lost} have no uri and there is no registrar to ring them at")
        return self

    def uri_of(self, agent: HumanAgent) -> str:
        return agent.uri or f"sip:{agent.name}@{self.registrar}"


class Outbound(_Strict):
    """Calls the server places (`callcenter dial`, the control API's POST /api/dial)."""
    flows: dict[str, Path] = Field(
        default_factory=dict, description="the flows a dialled call may run, by name (a dial names one of "
                                          "these, never a path); a relative path is relative to this file")
    allow: list[str] = Field(
        default_factory=list, description="destinations that may be dialled, as patterns (* and ?): numbers "
                                          "as +14155550100 or 4155550100, SIP URIs as sip:user@host:port. "
                                          "Empty: nothing may be dialled (no toll fraud by default)")
    deny: list[str] = Field(default_factory=list, description="patterns never dialled, even when allowed "
                                                              "(premium-rate numbers, emergency services)")
    trunk: str | None = Field(None, description="host[:port] a number is sent to (sip:NUMBER@trunk); absent: "
                                                "the registrar's domain; with neither, only SIP URIs are dialled")
    caller_id: str | None = Field(None, description="the caller ID presented (a P-Asserted-Identity header, "
                                                    "e.g. sip:+14155550100@pbx.example or +14155550100)")
    ring_s: float = Field(30.0, gt=0, le=300, description="how long a dialled phone rings before no_answer")
    max_calls: int | None = Field(None, ge=1, le=PJSUA_MAX_CALLS,
                                  description="dialled calls at once (they take call slots like any call)")

    @field_validator("flows")
    @classmethod
    def _flow_names(cls, v: dict[str, Path]) -> dict[str, Path]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
                raise ValueError(f"flow name {name!r}: letters, digits, _ and - only")
        return v


class WebhookConfig(_Strict):
    url: str = Field(pattern=r"^https?://[^\s]+$", description="where each ended call is POSTed (JSON)")
    secret_env: str = Field("CALLCENTER_WEBHOOK_SECRET", description="environment variable holding the "
                                                                    "HMAC-SHA256 signing secret (never this file)")
    attempts: int = Field(5, ge=1, le=20, description="tries before the call goes to the dead letters")
    backoff_s: float = Field(2.0, ge=0, le=3600, description="wait before the 2nd try; doubled for each next")

    def secret(self) -> str:
        value = os.environ.get(self.secret_env, "")
        if not value:
            raise ValueError(f"environment variable {self.secret_env} (the webhook's signing secret) is not set")
        return value


class AfterCall(_Strict):
    """Post-call work: every ended call gets a summary, categories and sentiment in the store."""
    webhook: WebhookConfig | None = Field(None, description="an end-of-call webhook, signed; off when absent")
    scorecards: list[Path] = Field(default_factory=list, description=(
        "quality scorecards (flows/scorecards/*.yaml), each for one flow by name: every ended call of that flow "
        "is scored; a relative path is relative to this file"))


class ServerConfig(_Strict):
    """The whole `serve` config (sip.yaml): SIP, media, WebRTC, control API, recordings, limits."""

    agent_user: str = Field("agent", description="the user part of the agent's SIP URI")
    listen: Listen = Listen()
    rtp_port: int = Field(40000, ge=1024, le=65000, description="first local RTP port")
    max_calls: int = Field(PJSUA_MAX_CALLS, ge=1, le=PJSUA_MAX_CALLS)
    codecs: list[Literal["PCMU", "PCMA"]] = Field(default_factory=lambda: ["PCMU", "PCMA"])
    recordings: Path = Path("recordings")
    registration: Registration | None = None
    control: Control | None = Field(None, description="the supervisor API; off when absent")
    webrtc: WebRtc | None = Field(None, description="browser callers (the /call page); off when absent")
    prompt_cache_mb: int = Field(PROMPT_CACHE_MB, ge=0, le=4096,
                                 description="sentences the voice said in full, kept in memory per process "
                                             "and reused by later calls (MB); 0: every call synthesises "
                                             "every sentence itself")
    warm_prompts: bool = Field(True, description="synthesise the flow's fixed sentences in the background "
                                                 "when the agent starts, before the first caller needs them")
    memory_trim_s: float = Field(TRIM_EVERY_S, ge=0, le=3600,
                                 description="hand the memory freed by ended calls back to the system at "
                                             "most this often (seconds); 0: never (RSS then creeps up "
                                             "under many calls)")
    malloc_arenas: int = Field(MALLOC_ARENAS, ge=0, le=64,
                               description="most malloc arenas the process may use (glibc's "
                                           "MALLOC_ARENA_MAX); 0: glibc's default of 8 per core. A "
                                           "cap of 2 made late frames 2.4x as common at 12 calls")
    decode_threads: int | None = Field(None, ge=1, le=64,
                                       description="caller turns the recognizer decodes at once in each agent "
                                                   "process; absent: one per core, the cores shared among "
                                                   "`serve --workers` processes (at least 1, at most 4)")
    retention_days: float | None = Field(None, gt=0, le=36500,
                                         description="delete recordings, transcripts and voicemail older than "
                                                     "this many days, at start and once a day; absent: keep all")
    contact_center: ContactCenter | None = Field(None, description="queues of human agents; off when absent")
    outbound: Outbound | None = Field(None, description="calls the server places; off when absent")
    after_call: AfterCall = Field(AfterCall(), description="what happens when a call ends (summary, webhook)")
    store: str | None = Field(
        None, description="the system of record every worker shares (queues, agents, one row per call): "
                          "sqlite:///callcenter.db (embedded; a relative path is relative to this file) or "
                          "postgresql://user@host:5432/dbname (many machines; the password from PGPASSWORD, or "
                          "the variable named by ?password_env=NAME, never from this file). Default: "
                          f"{DEFAULT_STORE_FILE} beside this file")
    _base: Path | None = PrivateAttr(None)  # the config file's folder (relative SQLite paths)
    acl: list[str] = Field(default_factory=list,
                           description="addresses or networks (CIDR) calls may come from, e.g. the SIP "
                                       "trunk and the load balancer; others get 403. Empty: any.")

    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="the load balancers (the project's Kamailio) whose word this worker takes on who "
                    "is calling: only a request whose packet comes from one of these (address, "
                    "address:port or network; judged by the packet's source, never by its Via) may "
                    "name a human agent (X-Callcenter-Agent) and so dial a keypad code. Give the "
                    "port where the balancer shares an address with callers (127.0.0.1:5060). "
                    "Empty: nobody, and agents change their state from the console only.")

    @field_validator("acl")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        return networks(v)

    @field_validator("store")
    @classmethod
    def _store(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                StoreUrl.parse(v, Path("/"))
            except StoreUrlError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _named_on_a_shared_store(self) -> "ServerConfig":
        # a worker is known to the others by its SIP address: 0.0.0.0:5062 would be every host's
        if self.store and self.store.startswith("postgresql") and ipaddress.ip_address(self.listen.host).is_unspecified:
            raise ValueError(f"listen.host {self.listen.host} cannot name this worker to the other hosts on "
                             "a shared store: give this host's own address")
        return self

    def outbound_flow(self, name: str) -> Path:
        """The file of an outbound flow named in `outbound.flows` (KeyError: no such name)."""
        if self.outbound is None:
            raise KeyError(name)
        path = self.outbound.flows[name]
        return path if path.is_absolute() else (self._base or Path.cwd()) / path

    def scorecard_paths(self) -> list[Path]:
        base = self._base or Path.cwd()
        return [p if p.is_absolute() else base / p for p in self.after_call.scorecards]

    def store_url(self) -> StoreUrl:
        """Where the store is: `store:`, else the deprecated contact_center.store, else
        callcenter.db beside the config file."""
        base = self._base or Path.cwd()
        if self.store:
            return StoreUrl.parse(self.store, base)
        if self.contact_center is not None and self.contact_center.store is not None:
            return StoreUrl.parse(str(self.contact_center.store), base)
        return StoreUrl.parse(DEFAULT_STORE_FILE, base)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: list[str]) -> list[str]:
        for entry in v:
            host, port = split_source(entry)
            if port is not None and not 1 <= port <= 65535:
                raise ValueError(f"{entry!r}: the port must be 1-65535")
            networks([host])
        return v

    def allows(self, source: str) -> bool:
        """Is a request from `source` ("203.0.113.5:5060", "[2001:db8::1]:5060") allowed?"""
        if not self.acl:
            return True
        address = source_address(source)
        return address is not None and any(address in ipaddress.ip_network(net, strict=False) for net in self.acl)

    def trusts_proxy(self, source: str) -> bool:
        """Did a packet from `source` ("127.0.0.1:5060") come from one of `trusted_proxies`?"""
        address = source_address(source)
        _, sport = split_source(source)
        if address is None:
            return False
        for entry in self.trusted_proxies:
            host, port = split_source(entry)
            if address in ipaddress.ip_network(host, strict=False) and (port is None or port == sport):
                return True
        return False


def split_source(source: str) -> tuple[str, int | None]:
    """"203.0.113.5:5060" → ("203.0.113.5", 5060); "[2001:db8::1]:5060" → ("2001:db8::1", 5060);
    "10.0.0.0/8" or "2001:db8::1" → (itself, None)."""
    source = source.strip()
    if source.startswith("["):
        host, _, port = source[1:].partition("]")
        port = port.lstrip(":")
    elif source.count(":") == 1:
        host, _, port = source.partition(":")
    else:
        host, port = source, ""
    try:
        return host, (int(port) if port else None)
    except ValueError:
        return host, -1


def source_address(source: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(split_source(source)[0])
    except ValueError:
        return None


def load_server_config(path: str | Path) -> ServerConfig:
    cfg, _ = load_model(path, ServerConfig)
    cfg._base = Path(path).resolve().parent
    return cfg
