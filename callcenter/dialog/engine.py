"""The dialog engine: walks a flow as the caller speaks or presses keys.

Pure and synchronous: inputs are what the caller did (an utterance, a keypad digit, silence), outputs
are actions for the call to carry out (say, listen, transfer, hang up). The same engine runs in live
calls and in offline simulations, so both give the same transcript.
"""

from __future__ import annotations

from dataclasses import dataclass

from callcenter.dialog.digits import spoken_digits
from callcenter.dialog.flow import AskNode, Flow, HangupNode, SayNode, TransferNode
from callcenter.dialog.nlu import IntentMatcher, words
from callcenter.voice.speaker import VoiceSettings

MAX_CHAIN = 50  # say→say chains longer than this are a flow bug, not a conversation
KEYPAD_END, KEYPAD_CLEAR = "#", "*"


@dataclass(frozen=True)
class Say:
    text: str
    voice: VoiceSettings | None = None  # None: the flow's voice


@dataclass(frozen=True)
class Listen:
    end_silence_ms: int
    timeout_s: float
    expect: tuple[str, ...]  # words the node expects
    kind: str = "speech"  # speech | yes_no | digits: shapes turn-taking and the recognizer's hint
    digits_min: int = 0
    digits_max: int = 0


@dataclass(frozen=True)
class Transfer:
    to: str


@dataclass(frozen=True)
class Hangup:
    pass


Action = Say | Listen | Transfer | Hangup


@dataclass(frozen=True)
class Decision:
    """Why the engine moved: for events and the supervisor."""

    node: str
    intent: str | None
    score: float
    via: str  # "speech", "keypad", "no_match", "no_input", "start"
    value: str | None = None  # the digit string a digits intent captured


class FlowError(RuntimeError):
    pass


class Dialog:
    def __init__(self, flow: Flow):
        self.flow = flow
        self.node_name = flow.start
        self.attempts = 0
        self.finished = False
        self.last_decision: Decision | None = None
        self.captured: dict[str, str] = {}  # digits intents' values, by intent name
        self.keyed = ""  # keypad digits collected for a digits intent
        self._matchers = {
            name: IntentMatcher({i: intent.examples for i, intent in node.intents.items()})
            for name, node in flow.nodes.items()
            if isinstance(node, AskNode)
        }

    @property
    def node(self):
        return self.flow.nodes[self.node_name]

    def start(self) -> list[Action]:
        self.last_decision = Decision(self.flow.start, None, 1.0, "start")
        return self._enter(self.flow.start)

    def _enter(self, name: str) -> list[Action]:
        actions: list[Action] = []
        for _ in range(MAX_CHAIN):
            self.node_name = name
            self.attempts = 0
            self.keyed = ""
            node = self.flow.nodes[name]
            if isinstance(node, SayNode):
                actions.append(Say(node.text, node.voice))
                name = node.next
                continue
            if isinstance(node, AskNode):
                actions += [Say(node.prompt, node.voice), self._listen(node)]
            elif isinstance(node, TransferNode):
                if node.text:
                    actions.append(Say(node.text, node.voice))
                actions.append(Transfer(node.to))
                self.finished = True
            elif isinstance(node, HangupNode):
                if node.text:
                    actions.append(Say(node.text, node.voice))
                actions.append(Hangup())
                self.finished = True
            return actions
        raise FlowError(f"flow {self.flow.name!r}: more than {MAX_CHAIN} say nodes in a row from {name!r}")

    @staticmethod
    def _listen(node: AskNode) -> Listen:
        expect = tuple(sorted({w for i in node.intents.values() for e in i.examples for w in e.lower().split()}))
        digits = _digits_intent(node)
        kind = node.expect
        if kind == "auto":
            examples = [e for i in node.intents.values() for e in i.examples]
            if digits:
                kind = "digits"
            elif examples and all(len(e.split()) <= 3 for e in examples) and \
                    {w for e in examples for w in words(e)} & {"yes", "no"}:
                kind = "yes_no"
            else:
                kind = "speech"
        spec = node.intents[digits].digits if digits else None
        return Listen(node.end_silence_ms, node.timeout_s, expect, kind,
                      spec.min_length if spec else 0, spec.max_length if spec else 0)

    def would_answer(self, text: str) -> bool:
        """Would this utterance settle the current node (an intent or a digit string matches)?"""
        node = self.node
        if self.finished or not isinstance(node, AskNode):
            return False
        if self._digits_match(node, text):
            return True
        return self._matchers[self.node_name].match(text).intent is not None

    @staticmethod
    def _digits_match(node: AskNode, text: str) -> tuple[str, str] | None:
        name = _digits_intent(node)
        if name is None:
            return None
        spec = node.intents[name].digits
        value = spoken_digits(text)
        return (name, value) if spec.min_length <= len(value) <= spec.max_length else None

    def _ask(self) -> AskNode:
        node = self.node
        if self.finished or not isinstance(node, AskNode):
            raise FlowError(f"not waiting for caller input (at node {self.node_name!r})")
        return node

    def on_utterance(self, text: str, confidence: float = 1.0) -> list[Action]:
        """What the caller said, with the recognizer's confidence (0..1)."""
        node = self._ask()
        if not text.strip():
            return self.on_no_input()
        if confidence < node.min_confidence:
            self.last_decision = Decision(self.node_name, None, confidence, "low_confidence")
            return self._retry(node, node.no_match)
        if found := self._digits_match(node, text):
            return self._captured(node, *found, via="speech")
        m = self._matchers[self.node_name].match(text)
        if m.intent is None:
            self.last_decision = Decision(self.node_name, None, m.score, "no_match")
            return self._retry(node, node.no_match)
        self.last_decision = Decision(self.node_name, m.intent, m.score, "speech")
        return self._enter(node.intents[m.intent].next)

    def _captured(self, node: AskNode, intent: str, value: str, via: str) -> list[Action]:
        self.captured[intent] = value
        self.last_decision = Decision(self.node_name, intent, 1.0, via, value)
        return self._enter(node.intents[intent].next)

    def on_dtmf(self, digit: str) -> list[Action]:
        node = self._ask()
        if (name := _digits_intent(node)) is not None:
            return self._keyed_digit(node, name, digit)
        for name, intent in node.intents.items():
            if intent.keypad == digit:
                self.last_decision = Decision(self.node_name, name, 1.0, "keypad")
                return self._enter(intent.next)
        self.last_decision = Decision(self.node_name, None, 0.0, "no_match")
        return self._retry(node, node.no_match)

    def _keyed_digit(self, node: AskNode, intent: str, digit: str) -> list[Action]:
        """Keys build the digit string: # ends it, * starts again, the maximum length ends it too."""
        spec = node.intents[intent].digits
        if digit == KEYPAD_CLEAR:
            self.keyed = ""
            self.last_decision = Decision(self.node_name, None, 0.0, "keypad")
            return []
        if digit != KEYPAD_END:
            self.keyed += digit
            if len(self.keyed) < spec.max_length:
                self.last_decision = Decision(self.node_name, None, 0.0, "keypad")
                return []
        value, self.keyed = self.keyed, ""
        if spec.min_length <= len(value) <= spec.max_length:
            return self._captured(node, intent, value, via="keypad")
        self.last_decision = Decision(self.node_name, None, 0.0, "no_match", value)
        return self._retry(node, node.no_match)

    @property
    def collecting_keys(self) -> bool:
        return bool(self.keyed)

    def on_no_input(self) -> list[Action]:
        node = self._ask()
        if self.keyed and (name := _digits_intent(node)) is not None:
            return self._keyed_digit(node, name, KEYPAD_END)  # the caller stopped keying: take what is there
        self.last_decision = Decision(self.node_name, None, 0.0, "no_input")
        return self._retry(node, node.no_input)

    def _retry(self, node: AskNode, apology: str) -> list[Action]:
        self.attempts += 1
        if self.attempts >= node.max_attempts:
            return self._enter(node.on_failure)
        return [Say(f"{apology} {node.prompt}", node.voice), self._listen(node)]


def _digits_intent(node: AskNode) -> str | None:
    return next((name for name, i in node.intents.items() if i.digits is not None), None)
