"""The dialog engine: walks a flow as the caller speaks or presses keys.

Pure and synchronous: inputs are what the caller did (an utterance, a keypad digit, silence), outputs
are actions for the call to carry out (say, listen, transfer, hang up). The same engine runs in live
calls and in offline simulations, so both give the same transcript.
"""

from __future__ import annotations

from dataclasses import dataclass

from callcenter.dialog.flow import AskNode, Flow, HangupNode, SayNode, TransferNode
from callcenter.dialog.nlu import IntentMatcher
from callcenter.voice.speaker import VoiceSettings

MAX_CHAIN = 50  # say→say chains longer than this are a flow bug, not a conversation


@dataclass(frozen=True)
class Say:
    text: str
    voice: VoiceSettings | None = None  # None: the flow's voice


@dataclass(frozen=True)
class Listen:
    end_silence_ms: int
    timeout_s: float
    expect: tuple[str, ...]  # words the node expects, a hint for the recognizer


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


class FlowError(RuntimeError):
    pass


class Dialog:
    def __init__(self, flow: Flow):
        self.flow = flow
        self.node_name = flow.start
        self.attempts = 0
        self.finished = False
        self.last_decision: Decision | None = None
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
        return Listen(node.end_silence_ms, node.timeout_s, expect)

    def _ask(self) -> AskNode:
        node = self.node
        if self.finished or not isinstance(node, AskNode):
            raise FlowError(f"not waiting for caller input (at node {self.node_name!r})")
        return node

    def on_utterance(self, text: str) -> list[Action]:
        node = self._ask()
        if not text.strip():
            return self.on_no_input()
        m = self._matchers[self.node_name].match(text)
        if m.intent is None:
            self.last_decision = Decision(self.node_name, None, m.score, "no_match")
            return self._retry(node, node.no_match)
        self.last_decision = Decision(self.node_name, m.intent, m.score, "speech")
        return self._enter(node.intents[m.intent].next)

    def on_dtmf(self, digit: str) -> list[Action]:
        node = self._ask()
        for name, intent in node.intents.items():
            if intent.keypad == digit:
                self.last_decision = Decision(self.node_name, name, 1.0, "keypad")
                return self._enter(intent.next)
        self.last_decision = Decision(self.node_name, None, 0.0, "no_match")
        return self._retry(node, node.no_match)

    def on_no_input(self) -> list[Action]:
        node = self._ask()
        self.last_decision = Decision(self.node_name, None, 0.0, "no_input")
        return self._retry(node, node.no_input)

    def _retry(self, node: AskNode, apology: str) -> list[Action]:
        self.attempts += 1
        if self.attempts >= node.max_attempts:
            return self._enter(node.on_failure)
        return [Say(f"{apology} {node.prompt}", node.voice), self._listen(node)]
