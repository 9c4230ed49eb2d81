"""LLM providers against servers speaking their wire protocols on loopback (OpenAI-compatible chat
completions and Anthropic Messages, both streamed), the time budget and fallbacks, webhooks that
fail, and a model's sentences reaching the caller while it is still writing."""

import asyncio
import json
import textwrap
import time
from pathlib import Path

import pytest
import structlog
from aiohttp import web

from callcenter.call.events import read_events
from callcenter.call.simulate import CallerStep, simulate_call
from callcenter.dialog.engine import Dialog, Fetch, LlmRequest, Think
from callcenter.dialog.flow import LlmProviderConfig, LlmTool, Slot, load_flow
from callcenter.dialog.llm import AnthropicMessages, LlmError, LocalTriage, OpenAiChat, SentenceStream
from callcenter.dialog.services import FlowServices
from callcenter.flowtest import serve_loopback

KEY = "sk-test-secret-123"


def request(**kw) -> LlmRequest:
    base = dict(node="triage", provider="default", instructions="Be brief.", knowledge=None,
                choices={"billing": ("Billing and payments", ("my bill",)), "outage": ("An outage", ())},
                slots={"account": Slot(type="digits", min_length=8, max_length=8)},
                tools={"human": LlmTool(type="transfer", to="sip:desk@127.0.0.1")}, history=(("caller", "hi"),
                                                                                            ("agent", "Hello.")),
                utterance="I was charged twice", time_budget_s=3.0, fallback="Sorry.")
    base.update(kw)
    return LlmRequest(**base)


class ProtocolServer:
    """Answers like an OpenAI-compatible server or the Anthropic Messages API, as told by `mode`."""

    def __init__(self):
        self.mode = "answer"
        self.seen: list[tuple[dict, dict]] = []
        self.url = ""

    def sse(self, response: web.StreamResponse, payload) -> bytes:
        return f"data: {json.dumps(payload) if not isinstance(payload, str) else payload}\n\n".encode()

    async def openai(self, req: web.Request):
        body = await req.json()
        self.seen.append((dict(req.headers), body))
        if self.mode == "500":
            return web.json_response({"error": "overloaded"}, status=500)
        if self.mode == "stall":  # answers nothing until the server closes (the client gives up first)
            await self.closing.wait()
            return web.json_response({"error": "closing"}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        if self.mode == "answer":
            for piece in ["There is an out", "age in your area. ", "It should be fixed by 6 pm", " today."]:
                await resp.write(self.sse(resp, {"choices": [{"delta": {"content": piece}}]}))
                await asyncio.sleep(0.3)
        elif self.mode in ("route", "bad_tool"):
            args = ['{"choice": "bil', 'ling", "account": "4721 9183"}'] if self.mode == "route" else ['{not json']
            await resp.write(self.sse(resp, {"choices": [{"delta": {"tool_calls": [
                {"index": 0, "function": {"name": "route", "arguments": args[0]}}]}}]}))
            for more in args[1:]:
                await resp.write(self.sse(resp, {"choices": [{"delta": {"tool_calls": [
                    {"index": 0, "function": {"arguments": more}}]}}]}))
        elif self.mode == "garbage":
            await resp.write(b"data: {{{ not json\n\ndata: 42\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def anthropic(self, req: web.Request):
        body = await req.json()
        self.seen.append((dict(req.headers), body))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        events = [
            {"type": "message_start", "message": {"id": "m1"}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me get "}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "someone. "}},
            {"type": "content_block_stop", "index": 0},
            {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "name": "human",
                                                                           "id": "t1", "input": {}}},
            {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
            {"type": "content_block_stop", "index": 1},
            {"type": "message_stop"},
        ]
        for e in events:
            await resp.write(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode())
        return resp

    async def __aenter__(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.openai)
        app.router.add_post("/v1/messages", self.anthropic)
        self.closing = asyncio.Event()
        self._serving = serve_loopback(app)
        self.url = await self._serving.__aenter__()
        return self

    async def __aexit__(self, *exc):
        self.closing.set()  # a stalled request ends now, not when its sleep would have (the runner waits for it)
        await self._serving.__aexit__(*exc)


def run(coro):
    return asyncio.run(coro)


def test_openai_compatible_streams_sentences_and_reports_tools(monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", KEY)

    async def main():
        async with ProtocolServer() as server:
            provider = OpenAiChat(LlmProviderConfig(kind="openai", base_url=server.url + "/v1", model="m",
                                                    api_key_env="TEST_LLM_KEY"))
            heard: list[tuple[float, str]] = []
            t0 = time.monotonic()
            stream = SentenceStream(lambda s: heard.append((time.monotonic() - t0, s)))
            reply = await provider.reply(request(), stream.feed)
            stream.close()
            total = time.monotonic() - t0
            assert reply.text == "There is an outage in your area. It should be fixed by 6 pm today."
            assert [s for _, s in heard] == ["There is an outage in your area.", "It should be fixed by 6 pm today."]
            assert heard[0][0] < total - 0.4  # the first sentence was out while the model kept writing
            headers, body = server.seen[-1]
            assert headers["Authorization"] == f"Bearer {KEY}" and body["stream"] is True
            assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
            assert {t["function"]["name"] for t in body["tools"]} == {"route", "human"}
            assert body["tools"][0]["function"]["parameters"]["properties"]["choice"]["enum"] == ["billing", "outage"]

            server.mode = "route"
            reply = await provider.reply(request(), lambda s: None)
            assert reply.choice == "billing" and reply.slots == {"account": "4721 9183"} and reply.tool is None
            server.mode = "bad_tool"
            reply = await provider.reply(request(), lambda s: None)
            assert reply.choice is None and reply.text == ""
            server.mode = "garbage"
            reply = await provider.reply(request(), lambda s: None)
            assert reply.text == "" and reply.choice is None
            server.mode = "500"
            with pytest.raises(LlmError, match="HTTP 500") as exc:
                await provider.reply(request(), lambda s: None)
            assert KEY not in str(exc.value)

    run(main())


def test_anthropic_messages_stream_and_tool_use(monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", KEY)

    async def main():
        async with ProtocolServer() as server:
            provider = AnthropicMessages(LlmProviderConfig(kind="anthropic", base_url=server.url,
                                                           api_key_env="TEST_LLM_KEY"))
            said = []
            reply = await provider.reply(request(), said.append)
            assert "".join(said) == "Let me get someone. " and reply.tool == "human"
            headers, body = server.seen[-1]
            assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
            assert body["system"].startswith("Be brief.") and body["messages"][0] == {"role": "user", "content": "hi"}
            assert {t["name"] for t in body["tools"]} == {"route", "human"}

    run(main())


def test_missing_key_is_a_clear_error_not_a_crash(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    provider = OpenAiChat(LlmProviderConfig(kind="openai", api_key_env="NO_SUCH_KEY_VAR"))
    with pytest.raises(LlmError, match="NO_SUCH_KEY_VAR"):
        run(provider.reply(request(), lambda s: None))


def test_time_budget_and_failures_become_the_fallback(monkeypatch, tmp_path):
    monkeypatch.setenv("TEST_LLM_KEY", KEY)

    async def main():
        async with ProtocolServer() as server:
            config = LlmProviderConfig(kind="openai", base_url=server.url + "/v1", api_key_env="TEST_LLM_KEY")
            services = FlowServices(load_flow("flows/triage.yaml"), providers={"default": OpenAiChat(config)})
            server.mode = "stall"
            t0 = time.monotonic()
            with structlog.testing.capture_logs() as logs:
                result = await services.think(Think(request(time_budget_s=0.5)), lambda s: None)
            assert result.reply is None and "within 0.5 s" in result.error and time.monotonic() - t0 < 1.5
            server.mode = "500"
            with structlog.testing.capture_logs() as more:
                result = await services.think(Think(request()), lambda s: None)
            assert result.reply is None and "HTTP 500" in result.error
            assert KEY not in json.dumps(logs + more, default=str)

    run(main())


def test_webhook_failures_are_results_not_crashes():
    async def main():
        services = FlowServices(load_flow("flows/triage.yaml"))
        refused = await services.fetch(Fetch("lookup", "GET", "http://127.0.0.1:9/x", {}, None, 1.0))
        assert refused.status is None and refused.error
        bad_url = await services.fetch(Fetch("lookup", "GET", "not a url", {}, None, 1.0))
        assert bad_url.error

    run(main())


def test_local_triage_offline():
    local = LocalTriage()

    async def ask(text, **kw):
        said = []
        reply = await local.reply(request(utterance=text, **kw), said.append)
        return reply, "".join(said)

    reply, said = run(ask("there's a charge on my invoice I don't recognise"))
    assert reply.choice == "billing" and said == ""
    reply, said = run(ask("hello, I need some help"))
    assert reply.choice is None and said.startswith("Just to check, is this about")
    reply, _ = run(ask("my account is 4721 9183 and I have a billing question"))
    assert reply.slots == {"account": "47219183"}
    knowledge = "Our shops open at 9 am. Engineers expect service back by 6 pm today."
    reply, said = run(ask("when will my internet be back", choices={}, knowledge=knowledge))
    assert said == "Engineers expect service back by 6 pm today."
    reply, said = run(ask("what's the weather like", choices={}, knowledge=knowledge))
    assert said == "I'm sorry, I don't have that information."


@pytest.mark.slow
def test_model_sentences_are_spoken_while_it_writes(tmp_path, stt, tts, monkeypatch):
    """A whole simulated call with an OpenAI-compatible model: its first sentence is on the line
    before the model has finished, and its decision (a tool) is carried out."""

    async def main():
        async with ProtocolServer() as server:
            flow_path = tmp_path / "flow.yaml"
            flow_path.write_text(textwrap.dedent(f"""\
                name: llm-call
                llm:
                  remote: {{kind: openai, base_url: "{server.url}/v1", model: m}}
                start: ask
                nodes:
                  ask:
                    type: llm
                    provider: remote
                    prompt: How can I help?
                    knowledge: There is an outage in Riverside.
                    next: bye
                    on_failure: bye
                  bye: {{type: hangup, text: Goodbye.}}
                """))
            flow = load_flow(flow_path)
            wav = tmp_path / "q.wav"
            from callcenter.audio.frames import float_to_pcm
            from callcenter.audio.wavfile import write_wav
            from callcenter.call.caller import speak

            write_wav(wav, float_to_pcm(speak("Is there an outage in my area?", "flite:slt")))
            result, events = await simulate_call(flow, [CallerStep(wav=wav)], tmp_path / "call", stt, tts)
            return result, read_events(events.path)

    result, events = run(main())
    kinds = [(e["kind"], e.get("text")) for e in events]
    said = [t for k, t in kinds if k == "agent_say"]
    assert said[:3] == ["How can I help?", "There is an outage in your area.", "It should be fixed by 6 pm today."]
    first_sentence = next(e for e in events if e["kind"] == "agent_say" and e["text"].startswith("There is"))
    reply = next(e for e in events if e["kind"] == "llm_reply")
    assert first_sentence["t"] < reply["t"] - 0.4 and reply["first_sentence_ms"] < reply["ms"]
    assert result.path[-1] == "bye" and said[-1] == "Goodbye."


def test_webhook_posts_templated_json_with_a_secret_header_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("CRM_TOKEN", "tok-987")
    seen = {}

    async def main():
        async def handle(req: web.Request):
            seen.update(headers=dict(req.headers), body=await req.json(), path=req.path_qs)
            return web.json_response({"ticket": {"id": 42}})

        app = web.Application()
        app.router.add_post("/tickets", handle)
        async with serve_loopback(app) as base:
            flow_path = tmp_path / "f.yaml"
            flow_path.write_text(textwrap.dedent(f"""\
                name: w
                env: [CRM_TOKEN]
                variables: {{base: "{base}", issue: "no dial tone"}}
                start: open
                nodes:
                  open:
                    type: webhook
                    method: POST
                    url: "{{base}}/tickets"
                    headers: {{Authorization: "Bearer {{CRM_TOKEN}}"}}
                    body: {{summary: "{{issue}}", caller: "{{caller}}", urgent: true}}
                    save: {{ticket: ticket.id}}
                    next: done
                    on_failure: done
                  done: {{type: hangup, text: "Ticket {{ticket}}."}}
                """))
            flow = load_flow(flow_path)
            d = Dialog(flow, variables={"caller": "sip:alice@127.0.0.1"}, encoder=None)
            (fetch,) = d.start()
            result = await FlowServices(flow).fetch(fetch)
            return d.on_fetched(result.status, result.data, result.error)

    actions = asyncio.run(main())
    assert seen["headers"]["Authorization"] == "Bearer tok-987" and seen["path"] == "/tickets"
    assert seen["body"] == {"summary": "no dial tone", "caller": "sip:alice@127.0.0.1", "urgent": True}
    assert actions[0].text == "Ticket 42."


def _event_stream_message(event_type: str, payload: dict) -> bytes:
    """One frame of AWS's binary event stream (what Bedrock's ConverseStream sends)."""
    import binascii
    import struct

    headers = b""
    for name, value in ((":event-type", event_type), (":content-type", "application/json"),
                        (":message-type", "event")):
        n, v = name.encode(), value.encode()
        headers += struct.pack("B", len(n)) + n + b"\x07" + struct.pack(">H", len(v)) + v
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(headers) + len(body) + 4, len(headers))
    message = prelude + struct.pack(">I", binascii.crc32(prelude)) + headers + body
    return message + struct.pack(">I", binascii.crc32(message))


def test_bedrock_converse_stream(monkeypatch):
    pytest.importorskip("boto3")
    from callcenter.dialog.llm import BedrockConverse

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEY)
    seen = {}

    async def main():
        async def converse(req: web.Request):
            seen.update(path=req.path, body=await req.json(), auth=req.headers.get("Authorization", ""))
            resp = web.StreamResponse(headers={"Content-Type": "application/vnd.amazon.eventstream"})
            await resp.prepare(req)
            for kind, payload in [
                ("messageStart", {"role": "assistant"}),
                ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Sure, one moment. "}}),
                ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Routing you now."}}),
                ("contentBlockStop", {"contentBlockIndex": 0}),
                ("contentBlockStart", {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t1",
                                                                                     "name": "route"}}}),
                ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"choice": "out'}}}),
                ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": 'age"}'}}}),
                ("contentBlockStop", {"contentBlockIndex": 1}),
                ("messageStop", {"stopReason": "tool_use"}),
            ]:
                await resp.write(_event_stream_message(kind, payload))
            return resp

        app = web.Application()
        app.router.add_post("/model/{model}/converse-stream", converse)
        async with serve_loopback(app) as url:
            provider = BedrockConverse(LlmProviderConfig(kind="bedrock", base_url=url, region="us-east-1",
                                                         model="test-model"))
            said = []
            reply = await provider.reply(request(), said.append)
            return reply, said

    reply, said = asyncio.run(main())
    assert "".join(said) == "Sure, one moment. Routing you now." and reply.choice == "outage"
    assert seen["path"] == "/model/test-model/converse-stream"
    assert seen["auth"].startswith("AWS4-HMAC-SHA256 Credential=AKIDTEST/") and KEY not in seen["auth"]
    assert {t["toolSpec"]["name"] for t in seen["body"]["toolConfig"]["tools"]} == {"route", "human"}
    assert seen["body"]["messages"][-1] == {"role": "user", "content": [{"text": "I was charged twice"}]}


def test_bench_calls_remote_reference_is_the_flow_pointed_at_a_loopback_stub(tmp_path):
    """`bench call --references`: a copy of the flow whose llm providers are all the OpenAI-compatible
    stub, which streams its reply sentence by sentence through the real remote provider."""
    from callcenter.lab.bench.call import _remote_flow
    from callcenter.lab.llm_stub import REPLY, LlmStub

    with LlmStub() as stub:
        path = _remote_flow(Path("flows/triage.yaml").resolve(), tmp_path / "flows", stub.url)
        flow = load_flow(path)
        assert {p.kind for p in flow.llm.values()} == {"openai"} and flow.llm["default"].base_url == stub.url
        sentences = []
        reply = run(OpenAiChat(flow.llm["default"]).reply(request(), SentenceStream(sentences.append).feed))
        assert stub.requests == 1 and reply.text == "".join(REPLY) and sentences[0] == REPLY[0].strip()
    assert load_flow("flows/triage.yaml").llm["default"].kind == "local"  # the original is untouched


def test_the_embedding_path_reads_dates_from_the_calls_own_day():
    """A simulated call at another date (`--at`) gets "tomorrow" counted from that day, not today."""
    req = request(utterance="can the engineer come tomorrow", slots={"day": Slot(type="date")}, choices={},
                  today="2027-03-01, Monday")
    assert run(LocalTriage().reply(req, lambda _: None)).slots == {"day": "2027-03-02"}
