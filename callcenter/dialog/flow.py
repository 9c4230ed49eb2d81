"""The flow language: a YAML script of nodes that says what the agent says and does.

This is the beginning of the full language (see the flow-language issue): node kinds `say`, `ask`,
`transfer` and `hangup`, intents given by example phrases and keypad digits, reprompts on no match
and no input. Flows hold no code: they only name nodes, phrases, digits and SIP URIs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from callcenter.voice.ambience import AmbienceSettings
from callcenter.voice.speaker import VoiceSettings, voice_problem
from callcenter.yamlfile import UserFileError, load_model

DTMF_DIGITS = "0123456789*#"
NODE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


VoiceField = Field(None, description="Voice for this node's prompts: a name (ssm:joe, ssm:awb, ssm:slt, "
                                     "espeak:en-us) or {name, speed, pitch}. Defaults to the flow's voice.")


def _as_voice(v):
    return VoiceSettings(name=v) if isinstance(v, str) else v


class _Speaks(_Strict):
    """A node that says something, in the flow's voice unless it names its own."""
    voice: VoiceSettings | None = VoiceField

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, v):
        return _as_voice(v)


class DigitString(_Strict):
    min_length: int = Field(1, ge=1, le=32)
    max_length: int = Field(16, ge=1, le=32)


class Intent(_Strict):
    examples: list[str] = Field(default_factory=list, description="Phrases a caller might say for this intent.")
    keypad: str | None = Field(None, description="A keypad digit that selects this intent.")
    digits: DigitString | None = Field(None, description="This intent is a digit string (an account number): "
                                                         "spoken, or keyed and ended with #.")
    next: str = Field(description="Node to go to when this intent matches.")

    @field_validator("keypad")
    @classmethod
    def _one_digit(cls, v: str | None) -> str | None:
        if v is not None and (len(v) != 1 or v not in DTMF_DIGITS):
            raise ValueError(f"keypad must be one of {' '.join(DTMF_DIGITS)}, got {v!r}")
        return v


class SayNode(_Speaks):
    type: Literal["say"]
    text: str = Field(min_length=1)
    next: str


class AskNode(_Speaks):
    type: Literal["ask"]
    prompt: str = Field(min_length=1)
    intents: dict[str, Intent] = Field(min_length=1)
    no_match: str = "Sorry, I didn't catch that."
    no_input: str = "Sorry, I didn't hear anything."
    max_attempts: int = Field(3, ge=1, le=10)
    timeout_s: float = Field(8.0, gt=0, le=120, description="Silence after the prompt before a no-input reprompt.")
    end_silence_ms: int = Field(700, ge=200, le=5000, description="Caller silence that ends their turn here.")
    min_confidence: float = Field(0.3, ge=0, le=1, description="A recognition less sure than this (0..1) is "
                                                                 "not acted on: the caller hears the no-match reprompt.")
    expect: Literal["auto", "speech", "yes_no", "digits"] = Field(
        "auto", description="What the caller answers here; shapes turn-taking (yes/no ends quickly, digit "
                            "strings allow pauses between groups). auto: digits if an intent takes digits, "
                            "yes_no if every example is a short yes/no phrase, else speech.")
    on_failure: str = Field(description="Node to go to after max_attempts of no match or no input.")


class TransferNode(_Speaks):
    type: Literal["transfer"]
    text: str | None = None
    to: str = Field(description="SIP URI to transfer the caller to (blind transfer with REFER).")

    @field_validator("to")
    @classmethod
    def _sip_uri(cls, v: str) -> str:
        if not re.match(r"^sips?:[^\s@]+@[^\s]+$|^sips?:[^\s@]+$", v):
            raise ValueError(f"not a SIP URI: {v!r} (expected sip:user@host[:port])")
        return v


class HangupNode(_Speaks):
    type: Literal["hangup"]
    text: str | None = None


Node = Annotated[Union[SayNode, AskNode, TransferNode, HangupNode], Field(discriminator="type")]


class Flow(_Strict):
    name: str
    version: int = 1
    voice: VoiceSettings = Field(default_factory=VoiceSettings,
                                 description="Voice for the whole flow: a name (ssm:joe — the default, ssm:awb, "
                                             "ssm:slt, espeak:en-us) or {name, speed, pitch}.")
    ambience: AmbienceSettings = Field(default_factory=AmbienceSettings,
                                       description="Phone-line ambience: a preset (clean, office, callcenter, "
                                                   "mobile) or {preset, enabled, hiss_db, bed_db, ...}.")
    start: str
    nodes: dict[str, Node] = Field(min_length=1)

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, v):
        return _as_voice(v) if v is not None else VoiceSettings()

    @field_validator("ambience", mode="before")
    @classmethod
    def _ambience(cls, v):
        return AmbienceSettings(preset=v) if isinstance(v, str) else (v if v is not None else AmbienceSettings())

    @field_validator("nodes")
    @classmethod
    def _names(cls, v: dict) -> dict:
        for name in v:
            if not NODE_NAME.match(name):
                raise ValueError(f"node name {name!r} must be letters, digits, _ or - and start with a letter")
        return v


def _targets(node) -> list[tuple[tuple, str]]:
    """(key path inside the node, target node name) for every reference a node makes."""
    if isinstance(node, SayNode):
        return [(("next",), node.next)]
    if isinstance(node, AskNode):
        refs = [(("on_failure",), node.on_failure)]
        refs += [(("intents", name, "next"), i.next) for name, i in node.intents.items()]
        return refs
    return []


def check_flow(flow: Flow) -> list[tuple[tuple, str]]:
    """Problems a valid-shaped flow can still have, as (key path, message)."""
    problems: list[tuple[tuple, str]] = []
    problem = voice_problem(flow.voice.name)
    if problem:
        problems.append((("voice",), problem))
    for name, node in flow.nodes.items():
        if node.voice is not None and (problem := voice_problem(node.voice.name)):
            problems.append((("nodes", name, "voice"), problem))
    if flow.start not in flow.nodes:
        problems.append((("start",), f"start node {flow.start!r} is not defined"))
    for name, node in flow.nodes.items():
        for sub, target in _targets(node):
            if target not in flow.nodes:
                problems.append((("nodes", name) + sub, f"unknown node {target!r}"))
        if isinstance(node, AskNode):
            digit_intents = [i for i, x in node.intents.items() if x.digits]
            if len(digit_intents) > 1:
                problems.append((("nodes", name, "intents", digit_intents[1], "digits"),
                                 f"only one intent per node may take digits ({digit_intents[0]!r} does)"))
            if digit_intents and any(x.keypad for x in node.intents.values()):
                problems.append((("nodes", name, "intents"),
                                 "keypad options and a digits intent in one node: keys go to the digit string"))
            seen_digit: dict[str, str] = {}
            seen_phrase: dict[str, str] = {}
            for iname, intent in node.intents.items():
                if not intent.examples and intent.keypad is None and intent.digits is None:
                    problems.append((("nodes", name, "intents", iname),
                                     "intent has no examples, keypad or digits"))
                if intent.digits and intent.digits.min_length > intent.digits.max_length:
                    problems.append((("nodes", name, "intents", iname, "digits"),
                                     "min_length is greater than max_length"))
                if intent.digits and intent.keypad is not None:
                    problems.append((("nodes", name, "intents", iname, "keypad"),
                                     "a digits intent collects keypad digits itself; drop keypad"))
                if intent.keypad is not None:
                    if intent.keypad in seen_digit:
                        problems.append(((("nodes", name, "intents", iname, "keypad")),
                                         f"keypad {intent.keypad} already selects {seen_digit[intent.keypad]!r}"))
                    seen_digit[intent.keypad] = iname
                for i, phrase in enumerate(intent.examples):
                    key = " ".join(phrase.lower().split())
                    if key in seen_phrase and seen_phrase[key] != iname:
                        problems.append((("nodes", name, "intents", iname, "examples", i),
                                         f"phrase {phrase!r} is also an example of {seen_phrase[key]!r}"))
                    seen_phrase.setdefault(key, iname)
    # reachability from start
    if flow.start in flow.nodes:
        seen, todo = set(), [flow.start]
        while todo:
            n = todo.pop()
            if n in seen or n not in flow.nodes:
                continue
            seen.add(n)
            todo.extend(t for _, t in _targets(flow.nodes[n]))
        for name in flow.nodes:
            if name not in seen:
                problems.append((("nodes", name), f"node {name!r} is unreachable from start {flow.start!r}"))
    return problems


def load_flow(path: str | Path) -> Flow:
    """Load and check a flow file; raise UserFileError listing every problem as file:line:col."""
    flow, doc = load_model(path, Flow)
    problems = check_flow(flow)
    if problems:
        raise UserFileError([f"{doc.where(loc)}: {msg}" for loc, msg in problems])
    return flow
