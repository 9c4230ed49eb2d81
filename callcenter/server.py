"""`callcenter serve`: answer SIP calls and run each through a CallSession."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from collections import OrderedDict

import structlog

from callcenter.aftercall.scorecard import load_scorecard
from callcenter.aftercall.webhook import DeadLetters, Webhook
from callcenter.aftercall.worker import PostCall
from callcenter.call.call_metrics import CallMetrics
from callcenter.call.call_row import Outbox
from callcenter.call.recording import make_private, repair_recordings
from callcenter.call.retention import DAY_S, purge_recordings
from callcenter.call.session import HOLD_ON_TEXT
from callcenter.campaign.callbacks import CallbackDialer
from callcenter.campaign.dialer import Dialer
from callcenter.dialog.callback import callback_flow
from callcenter.dialog.flow import spoken_prompts
from callcenter.dialog.library import FlowLibrary
from callcenter.dialog.services import FlowServices
from callcenter.errors import CallcenterError
from callcenter.hearing.decoding import default_threads
from callcenter.hearing.stt import WhisperStt
from callcenter.hearing.vad import SileroVad
from callcenter.memory import MemoryKeeper, freeze_startup_objects, limit_arenas
from callcenter.store.adopt import adopt_legacy_store
from callcenter.store.callbacks import CallbackStore
from callcenter.store.calls import CallRecords
from callcenter.store.campaigns import CampaignStore
from callcenter.store.db import open_database
from callcenter.store.queues import HEARTBEAT_S, QueueStore
from callcenter.store.schema import migrate
from callcenter.store.workers import WorkerRegistry
from callcenter.telephony.config import ServerConfig, load_server_config
from callcenter.telephony.live_call import LiveCall
from callcenter.telephony.outbound import DialRefused, OneFlow, OutboundSipCall, destination, dial_variables
from callcenter.telephony.sip import (
    SIP_OK,
    CallInfo,
    SipCall,
    SipEndpoint,
    SipError,
)
from callcenter.telephony.sip_call import AgentCodeCall, SipLiveCall
from callcenter.telephony.webrtc_call import WebRtcLiveCall
from callcenter.voice.ambience import Ambience
from callcenter.voice.speaker import make_tts

log = structlog.get_logger()

ANSWER_TIMEOUT_S = 5.0  # a SIP caller who has not ACKed our 200 OK by then is hung up: the slot is freed
POST_CALL_DRAIN_S = 5.0  # at shutdown, the last calls' summaries and webhooks get this long
DIALLED_KEPT = 1000  # dialled calls the control API can still report on


class CallServer:
    """One process's call server: SIP endpoint, WebRTC gateway, control API, and the live calls."""

    def __init__(self, config: ServerConfig, flows: FlowLibrary, stt: WhisperStt, tts):
        self.config = config
        self.flows = flows
        self.stt = stt
        self.tts = tts
        self.live: dict[str, LiveCall] = {}
        self.endpoint: SipEndpoint | None = None
        self.control = None  # the supervisor API, when configured
        self.webrtc = None  # the browser callers' gateway, when configured
        self._services: dict[str, FlowServices] = {}  # by flow name: the inbound flow, the outbound ones
        self.outbound_flows: dict[str, FlowLibrary] = {}  # the flows a dial may run (outbound.flows)
        self.dialled: OrderedDict[str, OutboundSipCall] = OrderedDict()  # recent dials, for GET /api/dial/{id}
        self.queues: QueueStore | None = None  # the contact center's shared queues and agents
        worker = f"{config.listen.host}:{config.listen.port}"
        # the system of record: one row per call, and the contact center's queues and agents
        self.store = open_database(config.store_url())
        migrate(self.store)
        if config.store is None and (config.contact_center is None or config.contact_center.store is None):
            adopt_legacy_store(self.store, config.recordings)
        self.calls = CallRecords(self.store, worker, socket.gethostname())
        self.outbox = Outbox()
        self.registry = WorkerRegistry(self.store, worker, socket.gethostname(), _version())
        cc = config.contact_center
        check_queues(self.flows.current, config)
        if cc is None:
            with self.store.transaction():
                self.calls.lost([worker])  # calls an earlier process on this address never finished
        else:  # the queue store's take-over ends those calls too, with its callers and agent legs
            self.queues = QueueStore(self.store, worker, host=socket.gethostname(), registry=self.registry)
            lost = self.queues.take_over()
            if lost:
                log.warning("queue_callers_lost", calls=lost, reason="left by an earlier process on this address")
            removed = self.queues.define_agents([(a.name, cc.uri_of(a), tuple(a.skills), a.logged_in)
                                                 for a in cc.agents])
            if removed:
                log.warning("agents_removed", agents=removed, reason="no longer in the server config")
            for flow_queue, q in self.flows.current.queues.items():
                if not isinstance(q, str):
                    self.queues.define_queue(flow_queue, q.agents, q.skills, q.strategy, q.service_level_s)
        hook = config.after_call.webhook
        try:
            webhook = Webhook(hook.url, hook.secret(), hook.attempts, hook.backoff_s, DeadLetters(self.store)) \
                if hook else None
        except ValueError as exc:
            raise CallcenterError(str(exc)) from None
        self.post_call = PostCall(self.calls, webhook, self._scorecards())  # summaries, scores, the webhook
        self.memory = MemoryKeeper(config.memory_trim_s)
        self.metrics = CallMetrics(self._active_calls, self._rejected_calls)
        if self.queues is not None:
            self.metrics.watch_queues(self.queues)

    def _scorecards(self) -> dict:
        """The config's scorecards by flow name, each checked against its flow where this server runs it."""
        flows = {lib.current.name: lib.current for lib in [self.flows, *self.outbound_flows.values()]}
        cards = [load_scorecard(path, flows) for path in self.config.scorecard_paths()]
        return {card.flow: card for card in cards}

    def _active_calls(self) -> dict[tuple[str, ...], float]:
        out = {("sip",): 0, ("webrtc",): 0}
        for live in list(self.live.values()):
            if not live.ended:
                out[(live.transport,)] = out.get((live.transport,), 0) + 1
        return out

    def _rejected_calls(self) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = {}
        for transport, source in (("sip", self.endpoint), ("webrtc", self.webrtc)):
            for reason, n in dict(getattr(source, "rejected", {}) or {}).items():
                out[(transport, reason)] = n
        return out

    def services_for(self, flow) -> FlowServices:
        """One set of webhook/model services per flow version, shared by its calls: the offline
        model's embeddings of choices and knowledge are computed once, not on every call's first turn."""
        services = self._services.get(flow.name)
        if services is None or services.flow is not flow:
            services = self._services[flow.name] = FlowServices(flow)
        return services

    def load_outbound_flows(self) -> None:
        """The flows a dial may run, by name, each watched for edits like the inbound flow."""
        out = self.config.outbound
        for name in (out.flows if out is not None else {}):
            library = FlowLibrary(self.config.outbound_flow(name), prepare=render_line_noise)
            check_queues(library.current, self.config)
            self.outbound_flows[name] = library
        self.post_call.scorecards = self._scorecards()  # now checked against the outbound flows too

    async def dial(self, to: str, flow_name: str, variables: dict | None = None,
                   caller_id: str | None = None) -> OutboundSipCall:
        """Place a call to `to` (a number or a SIP URI) that runs the outbound flow `flow_name`
        (DialRefused: not allowed, no such flow, bad variables, no free slot)."""
        out = self.config.outbound
        if out is None:
            raise DialRefused("this server places no calls: its config has no outbound: section", 403)
        library = self.outbound_flows.get(str(flow_name))
        if library is None:
            raise DialRefused(f"no outbound flow {flow_name!r}; the config's outbound.flows has: "
                              f"{', '.join(sorted(self.outbound_flows)) or 'none'}", 404)
        return await self._place(to, library, dial_variables(variables or {}, library.current), caller_id)

    async def dial_callback(self, number: str, flow_name: str, queue: str) -> OutboundSipCall:
        """Call back a caller who asked for it in `queue` of flow `flow_name` (the inbound flow or an
        outbound one): the queue's intro, then its place in the queue (DialRefused as `dial`)."""
        if self.config.outbound is None:
            raise DialRefused("this server places no calls: its config has no outbound: section", 403)
        libraries = [self.flows, *self.outbound_flows.values()]
        flow = next((lib.current for lib in libraries if lib.current.name == flow_name), None)
        if flow is None:
            raise DialRefused(f"no flow {flow_name!r} on this server to call back from", 404)
        try:
            library = OneFlow(callback_flow(flow, queue))
        except KeyError as exc:
            raise DialRefused(f"flow {flow_name!r}: {exc}", 404) from None
        return await self._place(number, library, {}, None)

    async def _place(self, to: str, library, given: dict, caller_id: str | None) -> OutboundSipCall:
        out = self.config.outbound
        reg = self.config.registration
        uri = destination(str(to), out, (reg.domain or reg.registrar.split(":", 1)[1]) if reg else None)
        dialled_now = sum(1 for lc in self.live.values() if lc.direction == "outbound" and not lc.ended)
        if out.max_calls is not None and dialled_now >= out.max_calls:
            raise DialRefused(f"{dialled_now} dialled calls already (outbound.max_calls)", 503)
        if self.full():
            raise DialRefused(f"no free call slot (max_calls {self.config.max_calls})", 503)
        live = OutboundSipCall(self, uri, str(to).strip(), library, given, out, caller_id)
        self.live[live.call_id] = live
        if self.control is not None:
            self.control.attach(live)
        try:
            await live.dial()
        except SipError as exc:
            live.log.warning("dial_failed", to=live.to, error=str(exc))
            live.on_disconnected(503, str(exc))  # its row says failed
            raise DialRefused(str(exc), 502) from None
        self.dialled[live.call_id] = live
        while len(self.dialled) > DIALLED_KEPT:
            self.dialled.popitem(last=False)
        return live

    def _on_incoming(self, call: SipCall, info: CallInfo) -> None:
        if info.agent and self.queues is not None and info.dialled.startswith("*"):
            AgentCodeCall(self, call, info)
            return
        live = SipLiveCall(self, call, info)
        self.live[live.call_id] = live
        if self.control is not None:
            self.control.attach(live)
        live.log.info("call_incoming", remote=info.remote_uri, sip_call_id=info.call_id)
        fut = self.endpoint.call_soon(call.answer_with, SIP_OK)
        fut.add_done_callback(lambda f: f.exception() and live.log.error("answer_failed", error=str(f.exception())))
        asyncio.get_running_loop().call_later(ANSWER_TIMEOUT_S, self._unanswered, live)

    def _unanswered(self, live: SipLiveCall) -> None:
        """Our 200 OK has had no ACK for ANSWER_TIMEOUT_S: a caller gone, or one holding call slots
        on purpose. Hang up so the slot is free for the next caller."""
        if live.task is None and not live.ended:
            live.log.warning("sip_call_not_acked", after_s=ANSWER_TIMEOUT_S, remote=live.remote_uri)
            self.endpoint.call_soon(live.call.terminate_unanswered)

    def other_calls(self, exclude: LiveCall | None = None) -> int:
        """Connected calls that are not on a SIP line (browser callers): they count toward the same
        cap as SIP calls. A browser offer still connecting takes no slot."""
        return sum(1 for live in list(self.live.values())
                   if live.transport != "sip" and live.task is not None and live is not exclude)

    def free_slots(self) -> int:
        """Calls this process could still place or take (an agent's leg needs one)."""
        if self.endpoint is None:  # not listening yet: browser calls only
            return max(0, self.config.max_calls - self.other_calls())
        return self.endpoint.free_slots()

    def full(self, exclude: LiveCall | None = None) -> bool:
        """Has the process all the calls it may take, SIP and browser together? Browser calls count
        once connected (and `exclude` not at all); each kind has its own cap as well."""
        sip = sum(1 for live in list(self.live.values()) if live.transport == "sip")
        browser = self.other_calls(exclude)
        webrtc_cap = self.config.webrtc.max_calls if self.config.webrtc else 0
        return sip + browser >= self.config.max_calls or (exclude is not None and browser >= webrtc_cap)

    def _on_browser_call(self, peer, remote_address: str) -> None:
        live = WebRtcLiveCall(self, peer, remote_address)
        self.live[live.call_id] = live
        if self.control is not None:
            self.control.attach(live)
        live.log.info("call_incoming", remote=live.remote_uri, transport="webrtc", codec=peer.codec[0])

    async def _start_webrtc(self) -> None:
        from callcenter.telephony.webrtc import WebRtcGateway, use_host_candidates

        cfg = self.config.webrtc
        if cfg.candidates:
            use_host_candidates(cfg.candidates)
        self.webrtc = WebRtcGateway(cfg.host, cfg.port, cfg.max_calls, self._on_browser_call, cfg.stun_servers,
                                    process_full=self.full,
                                    peer_networks=cfg.peer_networks, connect_timeout_s=cfg.connect_timeout_s)
        try:
            await self.webrtc.start()
        except OSError as exc:
            self.webrtc = None
            raise SipError(f"cannot listen for browser calls on {cfg.host}:{cfg.port}: {exc}") from None

    async def warm_prompts(self, flow) -> None:
        """Synthesise the flow's fixed sentences into the voice's prompt cache, one after another,
        while the agent already answers (a caller who needs one meanwhile shares its rendering)."""
        prompts = spoken_prompts(flow) + [(HOLD_ON_TEXT, flow.voice)]
        started = time.monotonic()
        for text, voice in prompts:
            try:
                async for _ in self.tts.stream(text, voice):
                    pass
            except Exception as exc:  # a voice that cannot say it now is the call's problem later, not ours
                log.warning("prompt_not_warmed", text=text, error=str(exc))
        log.info("prompts_warmed", flow=flow.name, version=flow.version, prompts=len(prompts),
                 seconds=round(time.monotonic() - started, 1), cached_mb=round(self.tts.cache.bytes / 2**20, 1))

    def center_event(self, kind: str, **data) -> None:
        """A contact-center event that belongs to no call (an agent's state changed): one JSON line
        in `<recordings>/contact-center-<YYYY-MM-DD>.jsonl` (mode 600), the day's record beside the
        calls' own JSONL."""
        line = {"kind": kind, "wall": round(time.time(), 3),
                "worker": f"{self.config.listen.host}:{self.config.listen.port}", **data}
        path = self.config.recordings / f"contact-center-{time.strftime('%Y-%m-%d')}.jsonl"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(json.dumps(line) + "\n")  # one write of one line: workers appending at once never interleave
        except OSError as exc:
            log.error("center_event_not_written", error=str(exc), event=kind)

    async def keep_queues(self) -> None:
        """This worker's heartbeat in the shared queue store; it also clears what dead workers left."""
        loop = asyncio.get_running_loop()
        while True:
            try:  # off the loop: a store across the network must never hold up the calls' media
                lost = await loop.run_in_executor(None, self.queues.heartbeat, self.free_slots())
                if lost:
                    log.warning("queue_callers_lost", calls=lost, reason="their worker stopped beating")
            except Exception as exc:  # a locked or full disk: the calls go on, the console says so in the log
                log.error("queue_heartbeat_failed", error=str(exc))
            await asyncio.sleep(HEARTBEAT_S)

    async def keep_registered(self) -> None:
        """Without a contact center: this worker's row in the store (address, host, version, free
        slots, control API), every HEARTBEAT_S, off the loop, and the end of dead workers' calls."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(None, self.registry.beat, self.free_slots())
                lost = await loop.run_in_executor(None, self.registry.reap_calls, self.calls)
                if lost:
                    log.warning("calls_lost", calls=lost, reason="their worker stopped beating")
            except Exception as exc:  # the store is away: calls go on, the console may miss this worker
                log.warning("worker_heartbeat_failed", error=str(exc))
            await asyncio.sleep(HEARTBEAT_S)

    async def keep_recordings(self, days: float) -> None:
        """Delete recordings older than `days`: now, then once a day (on a thread: a large folder
        must not hold up the calls)."""
        loop = asyncio.get_running_loop()
        while True:
            removed = await loop.run_in_executor(None, purge_recordings, self.config.recordings, days)
            log.info("recordings_purged", files=len(removed), retention_days=days)
            await asyncio.sleep(DAY_S)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self.endpoint = SipEndpoint(self.config, loop, self._on_incoming, self.other_calls)
        self.endpoint.start()
        background: list[asyncio.Task] = [asyncio.create_task(self.flows.watch())]
        background += [asyncio.create_task(library.watch()) for library in self.outbound_flows.values()]
        if self.config.warm_prompts and self.config.prompt_cache_mb:
            background.append(asyncio.create_task(self.warm_prompts(self.flows.current)))
            background += [asyncio.create_task(self.warm_prompts(lib.current)) for lib in self.outbound_flows.values()]
            # an edited flow's new sentences too, while calls go on
            self.flows.on_reload = lambda flow: background.append(asyncio.create_task(self.warm_prompts(flow)))
        if self.config.memory_trim_s:
            background.append(asyncio.create_task(self.memory.run()))
        background.append(asyncio.create_task(self.outbox.keep_retrying()))
        background.append(asyncio.create_task(self.post_call.run()))
        if self.config.outbound is not None:  # the fleet's campaign dialer, on whichever worker holds its lease
            callbacks = CallbackDialer(CallbackStore(self.store), self.dial_callback, self.free_slots, self.calls.get) \
                if self.queues is not None else None
            dialer = Dialer(CampaignStore(self.store), self.dial, self.free_slots, self.registry.worker, self.calls.get,
                            callbacks=callbacks)
            background.append(asyncio.create_task(dialer.run()))
        if self.config.retention_days:
            background.append(asyncio.create_task(self.keep_recordings(self.config.retention_days)))
        if self.config.control is not None:
            from callcenter.supervisor.api import ControlApi, control_token

            control = self.config.control
            self.control = ControlApi(self, control, self.config.recordings,
                                      control_token(control, self.config.recordings))
            try:
                await self.control.start()
            except OSError as exc:
                self.endpoint.stop()
                raise SipError(f"cannot listen for the control API on {control.host}:{control.port}: {exc}") from None
            self.registry.control = self.control.url
        # one heartbeat: the queue store's (it also clears what dead workers left in the queues), else
        # the registry's own
        background.append(asyncio.create_task(self.keep_queues() if self.queues is not None else self.keep_registered()))
        if self.config.webrtc is not None:
            try:
                await self._start_webrtc()
            except SipError:
                self.endpoint.stop()
                raise
        try:
            await stop.wait()
        finally:
            for task in background:
                task.cancel()
            if self.webrtc is not None:
                await self.webrtc.stop()
            if self.control is not None:
                await self.control.stop()
            for live in list(self.live.values()):
                live.session.end("agent")
            tasks = [lc.task for lc in self.live.values() if lc.task]
            if tasks:
                await asyncio.wait(tasks, timeout=3)
            await loop.run_in_executor(None, self.endpoint.stop)
            await loop.run_in_executor(None, self.outbox.retry)  # the ended calls' rows
            await self.post_call.drain(POST_CALL_DRAIN_S)  # and their summaries
            if len(self.outbox):
                log.error("store_writes_lost", writes=len(self.outbox), note="the store did not answer before the stop")
            if self.queues is not None:
                self.queues.forget_worker()
            else:
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(None, self.registry.forget)


def render_line_noise(flow) -> None:
    """A flow version's line noise, rendered when it loads, not while its first caller waits."""
    Ambience(flow.ambience)


def check_queues(flow, config: ServerConfig) -> None:
    """A flow's queues against the server's contact center, at start: a queue of human agents
    without a contact center is refused (it would fail only when a caller reached it), and an agent
    a queue names who is not in the config is a warning with the nearest configured name."""
    from callcenter.dialog.flow import did_you_mean

    queues = {name: q for name, q in flow.queues.items() if not isinstance(q, str)}
    if not queues:
        return
    if config.contact_center is None:
        raise CallcenterError(f"flow {flow.name!r} sends callers to the queue(s) {', '.join(sorted(queues))}, but the "
                              "server config has no contact_center: section (its agents); add one, or make the "
                              "queue a SIP URI")
    known = [a.name for a in config.contact_center.agents]
    for qname, q in queues.items():
        for agent in q.agents:
            if agent not in known:
                log.warning("queue_agent_unknown", queue=qname, agent=agent,
                            hint=did_you_mean(agent, known).strip(" ()") or "add them to contact_center.agents")
        if not q.agents and not any(set(q.skills) & set(a.skills) for a in config.contact_center.agents):
            log.warning("queue_without_agents", queue=qname, note="no configured agent takes its calls")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("callcenter")
    except PackageNotFoundError:
        return ""


def serve(config_path: str, flow_path: str, stt_model: str | None = None) -> int:
    config = load_server_config(config_path)
    limit_arenas(config.malloc_arenas)  # before the models' and media threads allocate
    flows = FlowLibrary(flow_path, prepare=render_line_noise)
    flow = flows.current
    make_private(config.recordings)  # 700 folders, 600 files, also for those of older versions
    fixed = repair_recordings(config.recordings)
    if fixed:
        log.warning("recordings_repaired", files=[str(p) for p in fixed])
    stt = WhisperStt(stt_model, workers=config.decode_threads or default_threads())
    tts = make_tts(flow.voice, cache_bytes=config.prompt_cache_mb * 2**20)
    SileroVad()  # load the VAD model now, not while the first caller waits for an answer
    Ambience(flow.ambience)  # and render the line's noise loops
    from callcenter.dialog.embed import shared_encoder

    shared_encoder()  # and the sentence embeddings for intents
    from callcenter.dialog.local_llm import warm_model

    try:
        warm_model(flow)  # and the offline generative model, when the flow's llm nodes will use it
    except Exception as exc:  # a broken model build: the hybrid falls back to the embedding path per turn
        log.error("llm_model_not_loaded", error=str(exc))
    agent = CallServer(config, flows, stt, tts)
    agent.load_outbound_flows()
    log.info("startup_objects_frozen", objects=freeze_startup_objects())  # out of the collector's way

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)

    try:
        asyncio.run(main())
    except SipError as exc:
        raise SystemExit(f"callcenter: {exc}") from None
    return 0
