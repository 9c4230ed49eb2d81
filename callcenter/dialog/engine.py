"""The dialog engine: walks a flow as the caller speaks or presses keys.

Pure and synchronous: inputs are what happened (an utterance, a keypad digit, silence, a webhook's
reply, a model's reply, a recorded message), outputs are actions for the call to carry out (say,
listen, fetch, think, record, transfer, hang up). Nothing here waits or touches the network: the
call (or `callcenter test`) carries out `Fetch` and `Think` and reports back. The same engine runs in
live calls, offline simulations and flow tests, so all three take the same path.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from callcenter.dialog.expr import ExprError, parse_expr, render
from callcenter.dialog.flow import (
    AskNode,
    BranchNode,
    Flow,
    HangupNode,
    LlmNode,
    LlmTool,
    MenuNode,
    QueueSettings,
    SayNode,
    SetNode,
    Slot,
    TransferNode,
    VoicemailNode,
    WebhookNode,
    sensitive_variables,
    trusted_variables,
)
from callcenter.dialog.nlu import IntentMatch, SemanticMatcher, words
from callcenter.dialog.redact import Redactor, mask_digits, mask_spoken_digits
from callcenter.dialog.slots import WEEKDAY_KEYS, extract, luhn_ok, parse_yes_no
from callcenter.errors import CallcenterError
from callcenter.text.digits import spoken_digits
from callcenter.text.expecting import Expecting
from callcenter.text.pan import mask_cards
from callcenter.voice.settings import VoiceSettings

MAX_CHAIN = 50  # nodes passed without the caller's input; more is a flow bug, not a conversation
KEYPAD_END, KEYPAD_CLEAR = "#", "*"


@dataclass(frozen=True)
class Say:
    text: str
    voice: VoiceSettings | None = None  # None: the flow's voice
    private: bool = False  # says a sensitive value in full (a read-back): kept out of the recording and cache
    audio: str | None = None  # a recorded prompt to play instead of synthesising `text`


@dataclass(frozen=True)
class Silence:
    """Say nothing for this long (a say node's pause_ms)."""
    ms: int


@dataclass(frozen=True)
class Listen:
    end_silence_ms: int
    timeout_s: float
    expect: tuple[str, ...]  # words the node expects
    kind: Expecting = Expecting.SPEECH  # shapes turn-taking and the recognizer's hint
    digits_min: int = 0
    digits_max: int = 0
    sensitive: bool = False  # the caller is giving a sensitive value (a card number): PCI handling


@dataclass(frozen=True)
class Transfer:
    to: str
    mode: str = "blind"  # blind (REFER) | warm (the agent briefs the person, then bridges)
    summary: str | None = None
    ring_s: float = 20.0


@dataclass(frozen=True)
class Enqueue:
    """Wait in a queue of human agents (hold music, announcements) until one answers; answer with
    `Dialog.on_queue_left` if the caller leaves it unanswered."""
    queue: str
    settings: QueueSettings
    whisper: str  # spoken to the agent alone before the caller is connected


@dataclass(frozen=True)
class Hangup:
    pass


@dataclass(frozen=True)
class Fetch:
    """An HTTP request for a webhook node; answer with `Dialog.on_fetched`."""
    node: str
    method: str
    url: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    timeout_s: float


@dataclass(frozen=True)
class LlmRequest:
    node: str
    provider: str
    instructions: str
    knowledge: str | None
    choices: dict[str, tuple[str, tuple[str, ...]]]  # name -> (description, examples)
    slots: dict[str, Slot]
    tools: dict[str, LlmTool]
    history: tuple[tuple[str, str], ...]  # (caller|agent, text), oldest first
    utterance: str
    time_budget_s: float
    fallback: str
    today: str = ""  # the call's date (YYYY-MM-DD, weekday), for slots said as "next Tuesday"
    acknowledgement: str = ""  # said at once when a slow offline model takes the turn ("" = silence)


@dataclass
class LlmReply:
    """What a model decided. `text` has already been spoken to the caller as it streamed."""
    text: str = ""
    choice: str | None = None
    slots: dict[str, Any] = field(default_factory=dict)
    tool: str | None = None
    tool_args: dict[str, Any] = field(default_factory=dict)
    via: str = ""  # the offline hybrid: which path decided (embedding, model, unsure, busy, failed)


@dataclass(frozen=True)
class Think:
    """An LLM turn; answer with `Dialog.on_thought`."""
    request: LlmRequest


@dataclass(frozen=True)
class Record:
    """Record a voicemail; answer with `Dialog.on_recorded`."""
    max_s: float
    end_silence_s: float
    beep: bool


Action = Say | Silence | Listen | Transfer | Enqueue | Hangup | Fetch | Think | Record


RESUME_QUESTION = "So, how can I help you?"  # an llm node without a prompt, given back by a supervisor


@dataclass(frozen=True)
class Decision:
    """Why the engine moved: for events and the supervisor."""

    node: str
    intent: str | None
    score: float
    via: str  # speech, keypad, no_match, no_input, low_confidence, start, global, webhook, llm, ...
    value: str | None = None  # the digit string a digits intent or slot captured
    detail: dict[str, Any] = field(default_factory=dict)


class Waiting(StrEnum):
    """What the dialog waits for before its next step."""

    CALLER = "caller"  # speech or keys
    FETCH = "fetch"  # a webhook's answer
    LLM = "llm"  # a model's reply
    RECORD = "record"  # a voicemail being left
    TRANSFER = "transfer"  # a transfer's outcome


class FlowError(CallcenterError, RuntimeError):
    pass


_MATCHERS: dict[int, tuple[Flow, dict[str, SemanticMatcher]]] = {}


def _matchers(flow: Flow, encoder) -> dict[str, SemanticMatcher]:
    """Intent matchers for every node that listens, built once per loaded flow (embedding the
    examples costs a few ms each)."""
    key = id(flow) * 2 + (encoder is not None)
    cached = _MATCHERS.get(key)
    if cached and cached[0] is flow:
        return cached[1]
    out: dict[str, SemanticMatcher] = {}
    for name, node in flow.nodes.items():
        if isinstance(node, MenuNode):
            node = node.as_ask()
        if isinstance(node, AskNode):
            out[name] = SemanticMatcher({i: x.examples for i, x in node.intents.items()}, encoder)
        elif isinstance(node, LlmNode):
            out[name] = SemanticMatcher({c: x.examples for c, x in node.choices.items()}, encoder)
    out[""] = SemanticMatcher({i: g.examples for i, g in flow.globals.intents.items()}, encoder)
    if len(_MATCHERS) > 64:
        _MATCHERS.clear()
    _MATCHERS[key] = (flow, out)
    return out


@dataclass(frozen=True)
class _DigitTarget:
    kind: str  # intent | slot
    name: str
    min_length: int
    max_length: int
    checksum: str | None = None
    sensitive: bool = False


def url_part(value: str) -> str:
    """A value put into a webhook URL: every reserved character encoded, dots too, so that a
    caller's `..` cannot climb the path and `/`, `?`, `#` or `@` cannot change where it goes."""
    return quote(value, safe="").replace(".", "%2E")


def call_clock(flow: Flow, now: dt.datetime | None = None) -> dt.datetime:
    """The call's wall clock: in the flow's `hours.timezone` when it has one (an aware `now` is
    converted, a naive one is taken as already in that zone), else the server's local time."""
    if flow.hours is None:
        return now or dt.datetime.now()
    zone = flow.hours.zone()
    if now is None:
        return dt.datetime.now(zone)
    return now.astimezone(zone) if now.tzinfo is not None else now.replace(tzinfo=zone)


GLOBAL_OVER_ANSWER = 0.8  # the match a global intent needs to win over a slot the caller's words fill


class Dialog:
    def __init__(self, flow: Flow, variables: dict[str, Any] | None = None, now: dt.datetime | None = None,
                 encoder="shared"):
        """`encoder`: sentence embeddings for intent matching ("shared": the process's MiniLM; None:
        word overlap only)."""
        if encoder == "shared":
            from callcenter.dialog.embed import shared_encoder

            encoder = shared_encoder()
        self.flow = flow
        self.node_name = flow.start
        self.attempts = 0
        self.finished = False
        self.waiting: Waiting | None = None
        self.last_decision: Decision | None = None
        self.captured: dict[str, str] = {}  # digits intents' and slots' values, by name
        self.keyed = ""  # keypad digits collected for a digit string
        self.path: list[str] = []
        self.no_match_total = 0
        self.no_input_total = 0
        self.llm_turns = 0
        self.llm_history: list[tuple[str, str]] = []
        self.now = call_clock(flow, now)
        is_open = flow.hours.is_open(self.now) if flow.hours else True
        self.variables: dict[str, Any] = {
            "caller": "", "caller_number": "", "call_id": "", "direction": "inbound", "flow": flow.name, "hour": self.now.hour, "minute": self.now.minute,
            "weekday": WEEKDAY_KEYS[self.now.weekday()], "date": self.now.date().isoformat(),
            "time": self.now.strftime("%H:%M"), "open": is_open, "closed": not is_open,
            "holiday": bool(flow.hours and self.now.date() in flow.hours.holidays),
            "last_utterance": "", "last_intent": None, "attempts": 0,
            "webhook_status": None, "llm_answer": "", "voicemail_path": None, "voicemail_s": 0,
            "amd": None,  # a dialled call: person, machine or unknown (answering-machine detection)
        }
        self.variables.update(flow.variables)
        self.variables.update({name: os.environ.get(name, "") for name in flow.env})  # secrets for webhooks
        self.variables.update(variables or {})
        self.sensitive = sensitive_variables(flow)
        self._trusted = trusted_variables(flow)
        self.masked: dict[str, Any] = {}  # sensitive variables' values as prompts may show them
        self.confirming: str | None = None  # the slot whose read-back awaits the caller's yes or no
        # what must never be stored or sent: env secrets, sensitive values, any card number; slots
        # the flow declares `sensitive: false` (an account or phone number) are not scanned for cards
        self.redactor = Redactor({n for node in flow.nodes.values() for n, slot in (getattr(node, "slots", None)
                                                                                      or {}).items()
                                  if slot.sensitive is False})
        for name in flow.env:
            self.redactor.add_secret(self.variables.get(name))
        self._matchers = _matchers(flow, encoder)
        self._asks = {n: node.as_ask() for n, node in flow.nodes.items() if isinstance(node, MenuNode)}

    # ------------------------------------------------------------ state
    @property
    def node(self):
        node = self.flow.nodes[self.node_name]
        return self._asks.get(self.node_name, node)

    def render(self, text: str, reveal=()) -> str:
        """A template filled for speech (or a model, or a summary): sensitive values masked unless
        named in `reveal`."""
        hidden = {k: v for k, v in self.masked.items() if k not in reveal}
        return render(text, {**self.variables, **hidden} if hidden else self.variables)

    def _say(self, text: str, node, recorded: bool = False) -> Say:
        """`recorded`: this is the node's own text or prompt, which its `audio` file may say instead."""
        reveal = [v for v in getattr(node, "reveal", None) or () if v in self.masked]
        audio = getattr(node, "audio", None) if recorded and not reveal else None
        return Say(self.render(text, reveal), getattr(node, "voice", None), private=bool(reveal), audio=audio)

    @property
    def collecting_sensitive(self) -> bool:
        """Is the caller being asked for a sensitive value right now?"""
        if self.finished or self.waiting != Waiting.CALLER:
            return False
        return self._asks_sensitive(self.node, self._digit_target(self.node))

    def _asks_sensitive(self, node, target: "_DigitTarget | None") -> bool:
        """Does `node` now ask for a sensitive value: its digit target, or any slot it still lacks
        (at ask and llm nodes alike: a caller may say the card number before it is their turn)?"""
        slots = getattr(node, "slots", None) or {}
        return bool(target and target.sensitive) or any(slots[s].is_sensitive for s in self._missing_slots(node))

    def _keep(self, name: str, value: Any) -> Any:
        """Store a captured value; a sensitive one becomes a secret of this call. Returns what may
        be shown of it (in events and decisions)."""
        self.variables[name] = value
        if name in self.sensitive and value not in (None, ""):
            self.masked[name] = self.redactor.add_digits(value)
            return str(self.masked[name])
        return value

    def start(self) -> list[Action]:
        self.last_decision = Decision(self.flow.start, None, 1.0, "start")
        return self._enter(self.flow.start)

    def _enter(self, name: str, actions: list[Action] | None = None) -> list[Action]:
        actions = actions if actions is not None else []
        for _ in range(MAX_CHAIN):
            self.node_name = name
            self.path.append(name)
            self.attempts = 0
            self.keyed = ""
            self.waiting = None
            self.confirming = None
            node = self.node
            if isinstance(node, SayNode):
                actions.append(self._say(node.text, node, recorded=True))
                if node.pause_ms:
                    actions.append(Silence(node.pause_ms))
                name = node.next
                continue
            if isinstance(node, SetNode):
                for var, value in node.values.items():
                    self.variables[var] = self.render(value) if isinstance(value, str) else value
                for var, source in node.compute.items():
                    try:
                        self.variables[var] = parse_expr(source).eval(self.variables)
                    except (TypeError, ExprError):
                        self.variables[var] = None
                name = node.next
                continue
            if isinstance(node, BranchNode):
                name = next((c.next for c in node.cases if parse_expr(c.when).truth(self.variables)), node.otherwise)
                continue
            if isinstance(node, AskNode):
                self.llm_turns = 0
                if node.reask and name in self.path[:-1] and not self._missing_slots(node):
                    for slot in node.slots:  # back at a question already answered: ask it again
                        self.variables.pop(slot, None)
                elif node.slots and not node.intents and not self._missing_slots(node):
                    name = node.next  # every value is known already: nothing to ask
                    continue
                prompt = self._ask_prompt(node)
                actions += [self._say(prompt, node, recorded=prompt == node.prompt), self._listen(node)]
                self.waiting = Waiting.CALLER
            elif isinstance(node, LlmNode):
                self.llm_turns = 0
                self.llm_history = []
                if node.prompt:
                    actions.append(self._say(node.prompt, node, recorded=True))
                actions.append(self._listen(node))
                self.waiting = Waiting.CALLER
            elif isinstance(node, WebhookNode):
                if node.say:
                    actions.append(self._say(node.say, node, recorded=True))
                actions.append(self._fetch(name, node))
                self.waiting = Waiting.FETCH
            elif isinstance(node, VoicemailNode):
                actions += [self._say(node.prompt, node, recorded=True), Record(node.max_s, node.end_silence_s, node.beep)]
                self.waiting = Waiting.RECORD
            elif isinstance(node, TransferNode):
                if node.text:
                    actions.append(self._say(node.text, node, recorded=True))
                to = node.to or self.flow.queues[node.queue]
                if isinstance(to, QueueSettings):
                    self.variables["queue"] = node.queue
                    self.variables["triage"] = self.triage()
                    actions.append(Enqueue(node.queue, to, self.render(to.whisper)))
                else:
                    actions.append(Transfer(to) if node.mode == "blind" else
                                   Transfer(to, "warm", self.render(node.summary, node.reveal), node.ring_s))
                self.waiting = Waiting.TRANSFER
                self.finished = not (node.on_failure or (node.queue and (node.on_timeout or node.on_callback)))
            elif isinstance(node, HangupNode):
                if node.text:
                    actions.append(self._say(node.text, node, recorded=True))
                actions.append(Hangup())
                self.finished = True
            else:  # subflow/return nodes are inlined by load_flow; anything else is a bug, not silence
                raise FlowError(f"node {name!r} of type {getattr(node, 'type', '?')!r} cannot run here "
                                "(load flows with load_flow)")
            return actions
        raise FlowError(f"flow {self.flow.name!r}: more than {MAX_CHAIN} nodes in a row without the caller "
                        f"from {name!r}")

    # ------------------------------------------------------------ listening
    def _ask_prompt(self, node: AskNode) -> str:
        missing = self._missing_slots(node)
        if missing and node.slots[missing[0]].prompt and (missing[0] != next(iter(node.slots)) or self.attempts):
            return node.slots[missing[0]].prompt
        return node.prompt

    def _missing_slots(self, node) -> list[str]:
        return [s for s in getattr(node, "slots", None) or {} if self.variables.get(s) in (None, "")]

    def _listen(self, node) -> Listen:
        examples = [e for i in getattr(node, "intents", getattr(node, "choices", {})).values() for e in i.examples]
        expect = tuple(sorted({w for e in examples for w in e.lower().split()}))
        target = self._digit_target(node)
        kind = getattr(node, "expect", "speech")
        if kind == "auto":
            slot_types = {node.slots[s].type for s in self._missing_slots(node)[:1]}
            if target:
                kind = Expecting.DIGITS
            elif "yes_no" in slot_types or examples and all(len(e.split()) <= 3 for e in examples) and \
                    {w for e in examples for w in words(e)} & {"yes", "no"}:
                kind = Expecting.YES_NO
            else:
                kind = Expecting.SPEECH
        return Listen(node.end_silence_ms, node.timeout_s, expect, Expecting(kind), target.min_length if target else 0,
                      target.max_length if target else 0, self._asks_sensitive(node, target))

    def _digit_target(self, node) -> _DigitTarget | None:
        if not isinstance(node, AskNode):
            return None
        for name, intent in node.intents.items():
            if intent.digits is not None:
                return _DigitTarget("intent", name, intent.digits.min_length, intent.digits.max_length,
                                    sensitive=intent.digits.sensitive)
        missing = self._missing_slots(node)
        if missing and node.slots[missing[0]].type == "digits":
            slot = node.slots[missing[0]]
            return _DigitTarget("slot", missing[0], slot.min_length, slot.max_length, slot.checksum,
                                slot.is_sensitive)
        return None

    def _listening(self):
        node = self.node
        if self.finished or self.waiting != Waiting.CALLER:
            raise FlowError(f"not waiting for caller input (at node {self.node_name!r}, waiting for "
                            f"{self.waiting or 'nothing'})")
        return node

    def would_answer(self, text: str) -> bool:
        """Would this utterance settle the current node (an intent, a slot or a digit string)?"""
        if self.finished or self.waiting != Waiting.CALLER:
            return False
        node = self.node
        if isinstance(node, LlmNode):  # the model decides, but a sentence that clearly names a choice is complete
            return self._matchers[self.node_name].match(text).intent is not None
        if self._spoken_digits(node, text):
            return True
        if isinstance(node, AskNode) and any(self._slot_value(node.slots[s], text) is not None
                                             for s in self._missing_slots(node)):
            return True
        return self._matchers[self.node_name].match(text).intent is not None

    def _spoken_digits(self, node, text: str) -> tuple[_DigitTarget, str] | None:
        target = self._digit_target(node)
        if target is None:
            return None
        value = spoken_digits(text)
        if not target.min_length <= len(value) <= target.max_length:
            return None
        if target.checksum == "luhn" and not luhn_ok(value):
            return None
        return target, value

    def _slot_value(self, slot: Slot, text: str):
        return extract(slot.type, text, self.now.date(), **slot.spec())

    # ------------------------------------------------------------ caller input
    def on_utterance(self, text: str, confidence: float = 1.0) -> list[Action]:
        """What the caller said, with the recognizer's confidence (0..1)."""
        node = self._listening()
        if not text.strip():
            return self.on_no_input()
        self.variables["last_utterance"] = mask_spoken_digits(text) if self.collecting_sensitive else mask_cards(text)
        if confidence < node.min_confidence:
            self.last_decision = Decision(self.node_name, None, confidence, "low_confidence")
            return self._retry(node, node.no_match, no_match=True)
        if self.confirming is not None and isinstance(node, AskNode):
            return self._confirm_answer(node, text)
        if found := self._spoken_digits(node, text):
            return self._captured(node, found[0], found[1], via="speech")
        own = self._matchers[self.node_name].match(text)
        answers = bool(node.slots) and any(self._slot_value(node.slots[n], text) is not None
                                           for n in self._missing_slots(node))
        if not answers and (glob := self._global_phrase(text)) is not None:
            return glob
        if own.intent is None:
            # a global intent ("a pharmacist please") beats an answer to this node's question ("yes
            # please") only when it is unmistakable
            if (glob := self._global_match(text, GLOBAL_OVER_ANSWER if answers else 0.0)) is not None:
                return glob
        if isinstance(node, LlmNode):
            return self._think(node, text)
        if node.slots:
            filled = self._fill_slots(node, text)
            if filled:
                self.last_decision = Decision(self.node_name, None, 1.0, "slots",
                                              detail={k: self.masked.get(k, self.variables[k]) for k in filled})
                return self._after_slots(node, filled)
        if own.intent is None:
            self.last_decision = Decision(self.node_name, None, own.score, "no_match")
            return self._retry(node, node.no_match, no_match=True)
        return self._chose(node, own, "speech")

    def _chose(self, node: AskNode, m: IntentMatch, via: str) -> list[Action]:
        self.last_decision = Decision(self.node_name, m.intent, m.score, via)
        self.variables["last_intent"] = m.intent
        return self._enter(node.intents[m.intent].next)

    def _global_match(self, text: str, at_least: float = 0.0) -> list[Action] | None:
        m = self._matchers[""].match(text)
        if m.intent is None or m.score < at_least:
            return None
        return self._go_global(m.intent, m.score, "global")

    def _global_phrase(self, text: str) -> list[Action] | None:
        """A global intent whose example the caller said word for word beats this node's loose match
        ("can I speak to the receptionist please" is the receptionist, not menu option 1), unless
        the node's own examples hold a longer phrase of the same sentence."""
        hit = self._matchers[""].phrase(text)
        if hit is None:
            return None
        own = self._matchers[self.node_name].phrase(text)
        if own is not None and own[1] >= hit[1]:
            return None
        return self._go_global(hit[0], 1.0, "global_phrase")

    def _go_global(self, intent: str, score: float, via: str) -> list[Action]:
        self.last_decision = Decision(self.node_name, intent, score, via)
        self.variables["last_intent"] = intent
        return self._enter(self.flow.globals.intents[intent].next)

    def _fill_slots(self, node: AskNode, text: str) -> list[str]:
        filled = []
        for name in self._missing_slots(node):
            value = self._slot_value(node.slots[name], text)
            if value is not None:
                self._keep(name, value)
                if node.slots[name].type == "digits":
                    self.captured[name] = value
                filled.append(name)
        return filled

    def _after_slots(self, node: AskNode, filled: list[str] = ()) -> list[Action]:
        for name in filled:
            if node.slots[name].confirm:  # read the value back before going on
                self.confirming = name
                return [self._say(node.slots[name].confirm, node), self._listen_yes_no(node)]
        if self._missing_slots(node):
            self.attempts = 0
            return [self._say(self._ask_prompt(node), node), self._listen(node)]
        return self._enter(node.next)

    def _listen_yes_no(self, node: AskNode) -> Listen:
        return replace(self._listen(node), kind=Expecting.YES_NO, digits_min=0, digits_max=0)

    def _confirm_answer(self, node: AskNode, text: str) -> list[Action]:
        """The caller's answer to a slot's read-back: yes goes on; no asks for the value again; a new
        value ("no, the fifth of March") is read back in turn; anything else asks for yes or no."""
        name = self.confirming
        slot = node.slots[name]
        value = self._slot_value(slot, text) if slot.type != "yes_no" else None
        if value is not None and value != self.variables.get(name):
            self._keep(name, value)
            self.last_decision = Decision(self.node_name, None, 1.0, "corrected",
                                          detail={name: self.masked.get(name, value)})
            return [self._say(slot.confirm, node), self._listen_yes_no(node)]
        answer = parse_yes_no(text)
        if answer is True:
            self.confirming = None
            self.last_decision = Decision(self.node_name, None, 1.0, "confirmed",
                                          detail={name: self.masked.get(name, self.variables.get(name))})
            return self._after_slots(node)
        if answer is False:
            self.confirming = None
            self.variables.pop(name, None)
            self.masked.pop(name, None)
            self.last_decision = Decision(self.node_name, None, 1.0, "not_confirmed")
            return [self._say(f"Sorry about that. {slot.prompt or node.prompt}", node), self._listen(node)]
        self.last_decision = Decision(self.node_name, None, 0.0, "no_match")
        return [self._say(f"Please say yes or no. {slot.confirm}", node), self._listen_yes_no(node)]

    def _captured(self, node, target: _DigitTarget, value: str, via: str) -> list[Action]:
        self.captured[target.name] = value
        shown = self._keep(target.name, value)
        self.last_decision = Decision(self.node_name, target.name if target.kind == "intent" else None, 1.0, via,
                                      shown)
        if target.kind == "intent":
            return self._enter(node.intents[target.name].next)
        return self._after_slots(node)

    def on_dtmf(self, digit: str) -> list[Action]:
        node = self._listening()
        if (target := self._digit_target(node)) is not None:
            if not self.keyed and getattr(node, "keypad_globals", False):
                for name, intent in self.flow.globals.intents.items():
                    if intent.keypad == digit:  # the operator's 0 works here too, as the first key
                        return self._go_global(name, 1.0, "global_keypad")
            return self._keyed_digit(node, target, digit)
        for name, intent in getattr(node, "intents", {}).items():
            if intent.keypad == digit:
                return self._chose(node, IntentMatch(name, 1.0, 0.0), "keypad")
        for name, intent in self.flow.globals.intents.items():
            if intent.keypad == digit:
                return self._go_global(name, 1.0, "global_keypad")
        self.last_decision = Decision(self.node_name, None, 0.0, "no_match")
        return self._retry(node, node.no_match, no_match=True)

    def _keyed_digit(self, node, target: _DigitTarget, digit: str) -> list[Action]:
        """Keys build the digit string: # ends it, * starts again, the maximum length ends it too."""
        if digit == KEYPAD_CLEAR:
            self.keyed = ""
            self.last_decision = Decision(self.node_name, None, 0.0, "keypad")
            return []
        if digit != KEYPAD_END:
            self.keyed += digit
            if len(self.keyed) < target.max_length:
                self.last_decision = Decision(self.node_name, None, 0.0, "keypad")
                return []
        value, self.keyed = self.keyed, ""
        if target.min_length <= len(value) <= target.max_length and \
                (target.checksum != "luhn" or luhn_ok(value)):
            return self._captured(node, target, value, via="keypad")
        self.last_decision = Decision(self.node_name, None, 0.0, "no_match",
                                      str(mask_digits(value)) if target.sensitive else value)
        return self._retry(node, node.no_match, no_match=True)

    @property
    def collecting_keys(self) -> bool:
        return bool(self.keyed)

    def on_no_input(self) -> list[Action]:
        node = self._listening()
        if self.keyed and (target := self._digit_target(node)) is not None:
            return self._keyed_digit(node, target, KEYPAD_END)  # the caller stopped keying: take what is there
        self.last_decision = Decision(self.node_name, None, 0.0, "no_input")
        return self._retry(node, node.no_input, no_match=False)

    def on_resume(self) -> list[Action]:
        """The call is given back by a supervisor (after a take-over) while the flow waits for the
        caller, who spoke to the supervisor meanwhile: ask again what the node was asking, with no
        apology for a silence that was not one, and no attempt counted."""
        node = self._listening()
        self.last_decision = Decision(self.node_name, None, 0.0, "resumed")
        if self.confirming is not None and isinstance(node, AskNode):
            return [self._say(node.slots[self.confirming].confirm, node), self._listen_yes_no(node)]
        if isinstance(node, AskNode):
            prompt = self._ask_prompt(node)
            return [self._say(prompt, node, recorded=prompt == node.prompt), self._listen(node)]
        return [self._say(getattr(node, "prompt", None) or RESUME_QUESTION, node), self._listen(node)]

    def _retry(self, node, apology: str, no_match: bool) -> list[Action]:
        self.attempts += 1
        self.variables["attempts"] = self.attempts
        g = self.flow.globals
        if no_match:
            self.no_match_total += 1
            if g.max_no_match and self.no_match_total >= g.max_no_match:
                return self._enter(g.on_no_match)
        else:
            self.no_input_total += 1
            if g.max_no_input and self.no_input_total >= g.max_no_input:
                return self._enter(g.on_no_input)
        if self.attempts >= node.max_attempts:
            return self._enter(node.on_failure)
        if self.confirming is not None and isinstance(node, AskNode):  # silent or unclear at a read-back
            return [self._say(f"{apology} {node.slots[self.confirming].confirm}", node), self._listen_yes_no(node)]
        if node.escalate:
            text = node.escalate[min(self.attempts, len(node.escalate)) - 1]
        else:
            prompt = self._ask_prompt(node) if isinstance(node, AskNode) else ""
            text = f"{apology} {prompt}".strip()
        return [self._say(text, node), self._listen(node)]

    # ------------------------------------------------------------ webhooks
    def _fetch(self, name: str, node: WebhookNode) -> Fetch:
        url = render(node.url, self.variables, encode=url_part, raw=self._trusted)
        # the webhook gets sensitive values in full (a payment service needs the card number)
        body = {k: render(v, self.variables) if isinstance(v, str) else v for k, v in node.body.items()}
        headers = {k: render(v, self.variables) for k, v in node.headers.items()}
        return Fetch(name, node.method, url, headers, body if node.method == "POST" else None, node.timeout_s)

    def on_fetched(self, status: int | None, data: Any, error: str | None = None) -> list[Action]:
        """The webhook's reply: HTTP status and parsed JSON, or an error (timeout, refused, not JSON)."""
        node = self.node
        if not isinstance(node, WebhookNode) or self.waiting != Waiting.FETCH:
            raise FlowError(f"no webhook is waiting (at node {self.node_name!r})")
        self.variables["webhook_status"] = status
        if error is None and (status is None or not 200 <= status < 300):
            error = f"HTTP {status}"
        if error is None and not isinstance(data, (dict, list)):
            error = "reply is not a JSON object"
        if error is not None:
            self.last_decision = Decision(self.node_name, None, 0.0, "webhook_failed", detail={"error": error})
            return self._enter(node.on_failure)
        saved, missing = {}, []
        for var, path in node.save.items():
            value = _dig(data, path)
            if value is None:
                value = node.defaults.get(var)
                if value is None:
                    missing.append(path)
            saved[var] = self.variables[var] = value
        if missing:  # never spoken as blank text: the flow's own path for it
            to = node.on_missing or node.on_failure
            self.last_decision = Decision(self.node_name, None, 0.0, "webhook_missing",
                                          detail={"missing": missing, "next": to})
            return self._enter(to)
        self.last_decision = Decision(self.node_name, None, 1.0, "webhook", detail=saved)
        return self._enter(node.next)

    # ------------------------------------------------------------ LLM
    def _think(self, node: LlmNode, text: str) -> list[Action]:
        request = LlmRequest(
            node=self.node_name, provider=node.provider, instructions=self.render(node.instructions, node.reveal),
            knowledge=node.knowledge, choices={n: (c.description, tuple(c.examples)) for n, c in node.choices.items()},
            slots=node.slots, tools=node.tools, history=tuple(self.llm_history), utterance=text,
            time_budget_s=node.time_budget_s, fallback=node.fallback,
            today=self.now.strftime("%Y-%m-%d, %A"),
            acknowledgement=(node.acknowledgements[sum(w == "caller" for w, _ in self.llm_history) % len(node.acknowledgements)]
                             if node.acknowledgements else ""))
        self.llm_history.append(("caller", text))
        self.waiting = Waiting.LLM
        self.last_decision = Decision(self.node_name, None, 0.0, "llm_request")
        return [Think(request)]

    def on_thought(self, reply: LlmReply | None, error: str | None = None) -> list[Action]:
        """The model's reply (its text already spoken), or None when it failed or ran out of time."""
        node = self.node
        if not isinstance(node, LlmNode) or self.waiting != Waiting.LLM:
            raise FlowError(f"no model turn is waiting (at node {self.node_name!r})")
        self.waiting = Waiting.CALLER
        if reply is None:
            self.last_decision = Decision(self.node_name, None, 0.0, "llm_failed", detail={"error": error or ""})
            return self._enter(node.on_failure, [self._say(node.fallback, node)])
        rejected = []
        if reply.tool is not None and reply.tool not in node.tools:
            rejected.append(f"tool {reply.tool!r} is not allowed here")
            reply.tool = None
        if reply.choice is not None and reply.choice not in node.choices:
            rejected.append(f"choice {reply.choice!r} is not one of {sorted(node.choices)}")
            reply.choice = None
        slots = {}
        for name, raw in reply.slots.items():
            slot = node.slots.get(name)
            if slot is None:
                rejected.append(f"slot {name!r} is not asked for here")
                continue
            value = self._slot_value(slot, str(raw))
            if value is None:
                rejected.append(f"slot {name!r}: {raw!r} is not a {slot.type}")
                continue
            slots[name] = self._keep(name, value)
        detail = {"slots": slots, **({"rejected": rejected} if rejected else {})}
        if reply.text:
            self.llm_history.append(("agent", reply.text))
            self.variables["llm_answer"] = reply.text
        if reply.tool is not None:
            tool = node.tools[reply.tool]
            self.last_decision = Decision(self.node_name, reply.tool, 1.0, "llm_tool", detail=detail)
            if tool.type == "transfer":
                self.waiting = Waiting.TRANSFER
                self.finished = True
                return [Transfer(tool.to)]
            self.finished = True
            return [Hangup()]
        if reply.choice is not None:
            self.last_decision = Decision(self.node_name, reply.choice, 1.0, "llm", detail=detail)
            self.variables["last_intent"] = reply.choice
            return self._enter(node.choices[reply.choice].next)
        self.llm_turns += 1
        if not reply.text:
            self.last_decision = Decision(self.node_name, None, 0.0, "llm_failed",
                                          detail={"error": "empty reply", **detail})
            return self._enter(node.on_failure, [self._say(node.fallback, node)])
        self.last_decision = Decision(self.node_name, None, 1.0, "llm_answer", detail=detail)
        if not node.choices:
            return self._enter(node.next)
        if self.llm_turns >= node.max_turns:
            return self._enter(node.on_failure)
        return [self._listen(node)]

    # ------------------------------------------------------------ voicemail and transfer results
    def on_recorded(self, path: str | None, seconds: float) -> list[Action]:
        node = self.node
        if not isinstance(node, VoicemailNode) or self.waiting != Waiting.RECORD:
            raise FlowError(f"no voicemail is being recorded (at node {self.node_name!r})")
        self.variables["voicemail_path"] = path
        self.variables["voicemail_s"] = round(seconds, 1)
        self.last_decision = Decision(self.node_name, None, 1.0, "voicemail", detail={"seconds": round(seconds, 1)})
        return self._enter(node.next)

    def triage(self) -> str:
        """What the flow learnt, in a sentence or two for the agent who takes the call: the caller's
        intent and the slots they gave (sensitive ones left out)."""
        parts = []
        intent = self.variables.get("last_intent")
        if intent:
            parts.append(f"They asked about {str(intent).replace('_', ' ')}.")
        slots = [n for node in self.flow.nodes.values() if isinstance(node, (AskNode, LlmNode)) for n in node.slots]
        for name in dict.fromkeys(slots):
            value = self.variables.get(name)
            if value in (None, "") or name in self.sensitive:
                continue
            parts.append(f"{name.replace('_', ' ')}: {value}.")
        return " ".join(parts) or "No details yet."

    def on_queue_left(self, result: str) -> list[Action]:
        """The caller left a queue of agents unanswered: `timeout` (its max_wait_s) goes to the
        node's on_timeout, `callback` (the caller pressed the callback key) to on_callback, anything
        else (no agent reachable) to on_failure; each falls back to on_failure, then to hanging up."""
        node = self.node
        self.variables["queue_result"] = result
        target = None
        if isinstance(node, TransferNode):
            target = {"timeout": node.on_timeout, "callback": node.on_callback}.get(result) or node.on_failure
        if target is None:
            self.finished = True
            return [Hangup()]
        self.finished = False
        self.last_decision = Decision(self.node_name, None, 0.0, f"queue_{result}")
        return self._enter(target)

    def on_transfer_failed(self) -> list[Action]:
        node = self.node
        if not isinstance(node, TransferNode) or node.on_failure is None:
            self.finished = True
            return [Hangup()]
        self.finished = False
        self.last_decision = Decision(self.node_name, None, 0.0, "transfer_failed")
        return self._enter(node.on_failure)


def _dig(data: Any, path: str) -> Any:
    """`customer.name`, `items.0.id`: a value inside a JSON reply, or None."""
    for part in path.split("."):
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and part.lstrip("-").isdigit() and -len(data) <= int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    if isinstance(data, (dict, list)):
        return json.dumps(data)
    return data
