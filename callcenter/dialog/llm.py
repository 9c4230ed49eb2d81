"""LLM providers for `llm` nodes: the offline default and HTTP clients for hosted or local servers.

Every provider has one method, `reply(request, on_text)`: it streams the words the caller should
hear to `on_text` as they arrive (the call speaks them sentence by sentence) and returns an
`LlmReply` with the decision (a choice, slots, a tool). The flow engine checks that decision against
the node's allow-lists; the provider never acts on it. Time budgets are the caller's job
(`asyncio.wait_for`), so a provider may simply be slow.

- `LocalTriage` (kind `local`, the default): no key, no network. Choices by sentence embeddings over
  their examples and descriptions, slots by the rule-based slot parsers, answers by picking the
  knowledge sentences nearest to the question, and a clarifying question naming the two likeliest
  choices when it is unsure. (Gemma 3 270M, the generative model on PyPI, is a base model measured
  unfit for dialogue here: it is not used.)
- `OpenAiChat` (kind `openai`): any OpenAI-compatible /chat/completions server with streaming and
  tool calls: vLLM, Ollama, llama.cpp server, OpenAI.
- `AnthropicMessages` (kind `anthropic`): the Messages API with streaming and tool use.
- `BedrockConverse` (kind `bedrock`, the optional extra `pip install -e '.[bedrock]'`): AWS Bedrock's
  ConverseStream through boto3; credentials and region from the usual AWS environment.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
from typing import Any, Awaitable, Callable, Protocol

import numpy as np
import structlog

from callcenter.dialog.engine import LlmReply, LlmRequest
from callcenter.dialog.flow import LlmProviderConfig
from callcenter.dialog.nlu import SemanticMatcher
from callcenter.dialog.slots import extract
from callcenter.errors import CallcenterError
from callcenter.text.pan import mask_cards

log = structlog.get_logger()

TextSink = Callable[[str], Any]
ROUTE_TOOL = "route"  # the tool remote models use to report a choice and slots
KNOWLEDGE_MIN_SIM = 0.35  # a knowledge sentence this close to the question answers it
# A question asking for a time, an amount or a place favours sentences that hold one.
ANSWER_TYPES = (
    (re.compile(r"\b(when|what time|how long|how soon|until when|by when|what hours?)\b"),
     re.compile(r"\b(\d{1,2}(:\d\d)?\s*(am|pm)|o'clock|today|tomorrow|tonight|morning|afternoon|evening|"
                r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|hours?|minutes?|days?)\b")),
    (re.compile(r"\b(how much|what does it cost|price|cost|fee)\b"),
     re.compile(r"(\$|\bdollars?\b|\bcents?\b|\bfree\b|\bcharge\b|\bcredit\b)")),
    (re.compile(r"\b(where|which area|what area)\b"), re.compile(r"\b(in|at|near)\s+[A-Z]")),
)
ANSWER_TYPE_BONUS = 0.1
DONT_KNOW = "I'm sorry, I don't have that information."
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


class LlmError(CallcenterError, RuntimeError):
    pass


class LlmProvider(Protocol):
    async def reply(self, request: LlmRequest, on_text: TextSink) -> LlmReply: ...


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text.strip()) if s.strip()]


class SentenceStream:
    """Collects streamed text and hands on each complete sentence, so speech can start with the
    first sentence while the model is still writing the rest."""

    def __init__(self, sink: Callable[[str], Any]):
        self.sink = sink
        self.buffer = ""
        self.text = ""

    def feed(self, delta: str) -> None:
        self.text += delta
        self.buffer += delta
        while (m := re.search(r"[.!?](\s+)", self.buffer)) is not None:
            sentence, self.buffer = self.buffer[: m.start() + 1], self.buffer[m.end():]
            if sentence.strip():
                self.sink(sentence.strip())

    def close(self) -> None:
        if self.buffer.strip():
            self.sink(self.buffer.strip())
        self.buffer = ""


# ------------------------------------------------------------------ offline
def rule_slots(request: LlmRequest) -> dict[str, Any]:
    """The node's slots as the slot rules read them from the caller's words, dates counted from the
    call's own day (`request.today`). The offline model's slot lines fill only what they miss: it
    reads dates, times and amounts worse (bench nlu's free-phrasing rows)."""
    today = dt.date.fromisoformat(request.today[:10]) if request.today else None
    found = {name: extract(slot.type, request.utterance, today, **slot.spec()) for name, slot in request.slots.items()}
    return {name: value for name, value in found.items() if value is not None}


class LocalTriage:
    def __init__(self, encoder=None):
        if encoder is None:
            from callcenter.dialog.embed import shared_encoder

            encoder = shared_encoder()
        self.encoder = encoder
        self._cache: dict[tuple, Any] = {}

    def _matcher(self, request: LlmRequest) -> SemanticMatcher:
        key = ("choices", request.node, tuple(request.choices.items()))
        if key not in self._cache:
            self._cache[key] = SemanticMatcher(
                {n: [desc, *examples] for n, (desc, examples) in request.choices.items()}, self.encoder)
        return self._cache[key]

    def _knowledge(self, text: str):
        key = ("knowledge", text)
        if key not in self._cache:
            sentences = split_sentences(text)
            self._cache[key] = (sentences, self.encoder.encode(sentences))
        return self._cache[key]

    async def reply(self, request: LlmRequest, on_text: TextSink) -> LlmReply:
        out = LlmReply()
        said = request.utterance
        out.slots.update(rule_slots(request))
        if request.choices:
            m = self._matcher(request).match(said)
            if m.intent is not None:
                out.choice = m.intent
                return out
        answer = self._answer(request, said)
        if answer:
            out.text = answer
        elif request.choices:
            out.text = self._clarify(request, said)
        elif request.knowledge:
            out.text = DONT_KNOW
        if out.text:
            on_text(out.text)
        return out

    def _answer(self, request: LlmRequest, said: str) -> str:
        if not request.knowledge:
            return ""
        sentences, vectors = self._knowledge(request.knowledge)
        if not sentences:
            return ""
        sims = vectors @ self.encoder.vector(said)
        asked = said.lower()
        for question, holds in ANSWER_TYPES:
            if question.search(asked):
                sims = sims + ANSWER_TYPE_BONUS * np.array([bool(holds.search(s)) for s in sentences])
        order = sims.argsort()[::-1]
        best = float(sims[order[0]])
        if best < KNOWLEDGE_MIN_SIM:
            return ""
        picked = [int(order[0])]
        if len(order) > 1 and float(sims[order[1]]) >= max(KNOWLEDGE_MIN_SIM, best - 0.05):
            picked.append(int(order[1]))
        return " ".join(sentences[i] for i in sorted(picked))

    def _clarify(self, request: LlmRequest, said: str) -> str:
        names = list(request.choices)
        descs = [request.choices[n][0].rstrip(".") for n in names]
        sims = self.encoder.encode(descs) @ self.encoder.vector(said)
        top = [descs[i] for i in sims.argsort()[::-1][:2]]
        top = [d[0].lower() + d[1:] if d[:2] != d[:2].upper() else d for d in top]
        if len(top) == 1:
            return f"Just to check, is this about {top[0]}?"
        return f"Just to check, is this about {top[0]}, or {top[1]}?"


# ------------------------------------------------------------------ hosted / local servers
def _system_prompt(request: LlmRequest) -> str:
    parts = [request.instructions.strip()]
    if request.knowledge:
        parts.append("Answer only from these facts; if they do not cover the question, say so:\n"
                     + request.knowledge.strip())
    if request.choices:
        listing = "\n".join(f"- {n}: {desc}" for n, (desc, _) in request.choices.items())
        parts.append(f"When you know which of these the caller needs, call the {ROUTE_TOOL} tool with it and "
                     f"say nothing else:\n{listing}\nIf you are unsure, ask one short clarifying question.")
    if request.slots:
        parts.append(f"Report these values with the {ROUTE_TOOL} tool when the caller gives them: "
                     + ", ".join(f"{n} ({s.type})" for n, s in request.slots.items()))
    parts.append("You are speaking on the phone: plain sentences, no lists, no markdown.")
    return "\n\n".join(parts)


def _tool_specs(request: LlmRequest) -> list[tuple[str, str, dict]]:
    """(name, description, JSON schema of the arguments) for every tool the node allows."""
    specs = []
    if request.choices or request.slots:
        props: dict[str, Any] = {n: {"type": "string", "description": f"{s.type} value"}
                                 for n, s in request.slots.items()}
        if request.choices:
            props["choice"] = {"type": "string", "enum": list(request.choices)}
        specs.append((ROUTE_TOOL, "Route the call and/or report values the caller gave.",
                      {"type": "object", "properties": props}))
    for name, tool in request.tools.items():
        what = tool.description or ("Transfer the caller to a person." if tool.type == "transfer" else "End the call.")
        specs.append((name, what, {"type": "object", "properties": {}}))
    return specs


def _apply_tool(reply: LlmReply, name: str, raw_args: str) -> None:
    try:
        args = json.loads(raw_args) if raw_args.strip() else {}
        if not isinstance(args, dict):
            raise ValueError("arguments are not an object")
    except ValueError as exc:
        log.warning("llm_bad_tool_call", tool=name, error=str(exc))
        return
    if name == ROUTE_TOOL:
        choice = args.pop("choice", None)
        reply.choice = str(choice) if choice else reply.choice
        reply.slots.update({k: v for k, v in args.items() if v not in (None, "")})
    else:
        reply.tool, reply.tool_args = name, args


def _messages(request: LlmRequest) -> list[dict]:
    """The conversation as a hosted model receives it: a card number never leaves the machine
    (PCI; the rule parsers have read the caller's own words for slots already, here)."""
    msgs = [{"role": "user" if who == "caller" else "assistant", "content": mask_cards(text)}
            for who, text in request.history]
    msgs.append({"role": "user", "content": mask_cards(request.utterance)})
    return msgs


async def _sse(response) -> Any:
    """The `data:` payloads of a server-sent event stream, as JSON objects (anything else skipped)."""
    async for raw in response.content:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except ValueError:
            event = None
        if isinstance(event, dict):
            yield event
        else:
            log.warning("llm_bad_stream_line", line=payload[:200])


class _HttpProvider:
    default_url = ""

    def __init__(self, config: LlmProviderConfig):
        self.config = config
        self.base_url = (config.base_url or self.default_url).rstrip("/")
        self.model = config.model

    def _key(self) -> str | None:
        env = self.config.api_key_env
        if env is None:
            return None
        key = os.environ.get(env)
        if not key:
            raise LlmError(f"environment variable {env} (the API key) is not set")
        return key

    async def _post(self, path: str, headers: dict, body: dict, handle: Callable[[Any], Awaitable[None]]) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            async with http.post(self.base_url + path, json=body, headers=headers) as response:
                if response.status != 200:
                    text = (await response.text())[:300]
                    raise LlmError(f"{self.base_url}{path}: HTTP {response.status}: {text}")
                await handle(response)


class OpenAiChat(_HttpProvider):
    default_url = "https://api.openai.com/v1"

    async def reply(self, request: LlmRequest, on_text: TextSink) -> LlmReply:
        out = LlmReply()
        body: dict[str, Any] = {"model": self.model or "gpt-4o-mini", "stream": True,
                                "max_tokens": self.config.max_tokens,
                                "messages": [{"role": "system", "content": _system_prompt(request)}, *_messages(request)]}
        specs = _tool_specs(request)
        if specs:
            body["tools"] = [{"type": "function", "function": {"name": n, "description": d, "parameters": p}}
                             for n, d, p in specs]
        headers = {"Authorization": f"Bearer {key}"} if (key := self._key()) else {}
        calls: dict[int, dict[str, str]] = {}
        text: list[str] = []

        async def handle(response) -> None:
            async for chunk in _sse(response):
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        text.append(delta["content"])
                        on_text(delta["content"])
                    for call in delta.get("tool_calls") or []:
                        slot = calls.setdefault(int(call.get("index", 0)), {"name": "", "arguments": ""})
                        fn = call.get("function") or {}
                        slot["name"] += fn.get("name") or ""
                        slot["arguments"] += fn.get("arguments") or ""

        await self._post("/chat/completions", headers, body, handle)
        out.text = "".join(text).strip()
        for call in calls.values():
            if call["name"]:
                _apply_tool(out, call["name"], call["arguments"])
        return out


class AnthropicMessages(_HttpProvider):
    default_url = "https://api.anthropic.com"
    version = "2023-06-01"

    async def reply(self, request: LlmRequest, on_text: TextSink) -> LlmReply:
        out = LlmReply()
        body: dict[str, Any] = {"model": self.model or "claude-haiku-4-5", "max_tokens": self.config.max_tokens,
                                "stream": True, "system": _system_prompt(request), "messages": _messages(request)}
        specs = _tool_specs(request)
        if specs:
            body["tools"] = [{"name": n, "description": d, "input_schema": p} for n, d, p in specs]
        headers = {"anthropic-version": self.version}
        if key := self._key():
            headers["x-api-key"] = key
        blocks: dict[int, dict[str, str]] = {}
        text: list[str] = []

        async def handle(response) -> None:
            async for event in _sse(response):
                kind = event.get("type")
                index = int(event.get("index", 0))
                if kind == "content_block_start":
                    block = event.get("content_block") or {}
                    if block.get("type") == "tool_use":
                        blocks[index] = {"name": block.get("name", ""), "arguments": ""}
                elif kind == "content_block_delta":
                    delta = event.get("delta") or {}
                    if delta.get("type") == "text_delta" and delta.get("text"):
                        text.append(delta["text"])
                        on_text(delta["text"])
                    elif delta.get("type") == "input_json_delta" and index in blocks:
                        blocks[index]["arguments"] += delta.get("partial_json", "")
                elif kind == "error":
                    raise LlmError(f"stream error: {event.get('error')}")

        await self._post("/v1/messages", headers, body, handle)
        out.text = "".join(text).strip()
        for block in blocks.values():
            _apply_tool(out, block["name"], block["arguments"])
        return out


class BedrockConverse:
    def __init__(self, config: LlmProviderConfig):
        try:
            import boto3
        except ImportError:
            raise LlmError("the bedrock provider needs boto3: pip install -e '.[bedrock]'") from None
        self.config = config
        self.client = boto3.client("bedrock-runtime", region_name=config.region,
                                   endpoint_url=config.base_url or None)

    async def reply(self, request: LlmRequest, on_text: TextSink) -> LlmReply:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, self._converse, request, lambda t: loop.call_soon_threadsafe(on_text, t))

    def _converse(self, request: LlmRequest, on_text: TextSink) -> LlmReply:
        import botocore.exceptions

        out = LlmReply()
        args: dict[str, Any] = {
            "modelId": self.config.model or "anthropic.claude-3-haiku-20240307-v1:0",
            "system": [{"text": _system_prompt(request)}],
            "messages": [{"role": m["role"], "content": [{"text": m["content"]}]} for m in _messages(request)],
            "inferenceConfig": {"maxTokens": self.config.max_tokens},
        }
        specs = _tool_specs(request)
        if specs:
            args["toolConfig"] = {"tools": [{"toolSpec": {"name": n, "description": d, "inputSchema": {"json": p}}}
                                            for n, d, p in specs]}
        blocks: dict[int, dict[str, str]] = {}
        text: list[str] = []
        try:
            response = self.client.converse_stream(**args)
            for event in response["stream"]:
                if "contentBlockStart" in event:
                    start = event["contentBlockStart"]
                    tool = (start.get("start") or {}).get("toolUse")
                    if tool:
                        blocks[start.get("contentBlockIndex", 0)] = {"name": tool.get("name", ""), "arguments": ""}
                elif "contentBlockDelta" in event:
                    block = event["contentBlockDelta"]
                    delta = block.get("delta") or {}
                    if delta.get("text"):
                        text.append(delta["text"])
                        on_text(delta["text"])
                    elif "toolUse" in delta and block.get("contentBlockIndex", 0) in blocks:
                        blocks[block.get("contentBlockIndex", 0)]["arguments"] += delta["toolUse"].get("input", "")
                elif any(k.endswith("Exception") for k in event):
                    raise LlmError(f"stream error: {event}")
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise LlmError(f"bedrock: {exc}") from None
        out.text = "".join(text).strip()
        for block in blocks.values():
            _apply_tool(out, block["name"], block["arguments"])
        return out


def make_provider(config: LlmProviderConfig) -> LlmProvider:
    if config.kind == "local":  # the embedding path, behind which the built offline model waits
        from callcenter.dialog.local_llm import default_local_provider

        return default_local_provider()
    if config.kind == "local-llm":
        from callcenter.dialog.local_llm import LocalLlm

        return LocalLlm()
    if config.kind == "openai":
        return OpenAiChat(config)
    if config.kind == "bedrock":
        return BedrockConverse(config)
    return AnthropicMessages(config)
