"""The flow language: a YAML script of nodes that says what the agent says and does.

Node kinds: `say`, `ask` (intents by example phrases and keypad, typed slots), `menu`, `branch`, `set`,
`webhook`, `llm`, `transfer`, `voicemail` and `hangup`; flow-wide `globals` (operator from anywhere,
repeated no-match or silence → a node). Flows hold no code: conditions are the safe expressions of
`dialog.expr`, prompts are templates that only substitute variables. `check_flow` finds what a
well-shaped flow can still get wrong, each problem with the key path it sits at (the loader turns
that into file:line:col).
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from callcenter.dialog.expr import ExprError, parse_expr, template_names
from callcenter.dialog.slots import SLOT_TYPES
from callcenter.voice.settings import AmbienceSettings, VoiceSettings, voice_problem
from callcenter.yamlfile import LocatedYaml, UserFileError, load_yaml, validation_problems

DTMF_DIGITS = "0123456789*#"
NODE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SIP_URI = re.compile(r"^sips?:[^\s@]+@[^\s]+$|^sips?:[^\s@]+$")
# Variables every call has. `hour`, `minute`, `weekday` (mon..sun) and `date` are the call's start time.
BUILTIN_VARIABLES = ("caller", "caller_number", "call_id", "direction", "flow", "hour", "minute", "weekday", "date", "time",
                     "open", "closed", "holiday",
                     "last_utterance", "last_intent", "attempts", "webhook_status", "llm_answer",
                     "voicemail_path", "voicemail_s", "queue", "queue_position", "queue_wait_minutes",
                     "queue_wait_s", "queue_result", "triage", "amd")
SlotType = Literal["digits", "number", "yes_no", "date", "time", "currency", "text"]
assert set(SlotType.__args__) == set(SLOT_TYPES)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


VoiceField = Field(None, description="Voice for this node's prompts: a name (ssm:heart, ssm:reed, ssm:kumo, "
                                     "ssm:allison, espeak:en-us) or {name, speed, pitch}. Defaults to the flow's voice.")


def _as_voice(v):
    return VoiceSettings(name=v) if isinstance(v, str) else v


class _Speaks(_Strict):
    """A node that says something, in the flow's voice unless it names its own."""
    voice: VoiceSettings | None = VoiceField
    audio: str | None = Field(None, description=(
        "A recorded prompt (a WAV file, relative to the flow file) played instead of synthesising the "
        "node's text or prompt, e.g. a voice talent's recording. The text is still what transcripts show "
        "and what a caller hears if the file cannot be played. Reprompts use the voice."))
    reveal: list[str] = Field(default_factory=list, description=(
        "Sensitive variables (a card number) this node may say in full, e.g. to read it back. Elsewhere "
        "a sensitive value is spoken masked ('ending in 1111'). Either way it is masked in the events, "
        "transcripts and logs, and the agent's voice is left out of the recording while it is said."))

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, v):
        return _as_voice(v)


def _keypad(v: str | None) -> str | None:
    if v is not None and (len(v) != 1 or v not in DTMF_DIGITS):
        raise ValueError(f"keypad must be one of {' '.join(DTMF_DIGITS)}, got {v!r}")
    return v


def _uri(v: str | None) -> str | None:
    if v is not None and not SIP_URI.match(v):
        raise ValueError(f"not a SIP URI: {v!r} (expected sip:user@host[:port])")
    return v


SENSITIVE_DESCRIPTION = ("The value is sensitive (a card number, PCI DSS): masked in events, transcripts, "
                         "logs and the console (************1111), its keypad digits not logged one by one, and "
                         "the caller's side of the recording silenced while it is given. The flow can still "
                         "send it to a webhook, or read it back where a node names it in `reveal`.")


class DigitString(_Strict):
    min_length: int = Field(1, ge=1, le=32)
    max_length: int = Field(16, ge=1, le=32)
    sensitive: bool = Field(False, description=SENSITIVE_DESCRIPTION)


class Intent(_Strict):
    examples: list[str] = Field(default_factory=list, description="Phrases a caller might say for this intent.")
    keypad: str | None = Field(None, description="A keypad digit that selects this intent.")
    digits: DigitString | None = Field(None, description="This intent is a digit string (an account number): "
                                                         "spoken, or keyed and ended with #.")
    next: str = Field(description="Node to go to when this intent matches.")

    @field_validator("keypad")
    @classmethod
    def _one_digit(cls, v: str | None) -> str | None:
        return _keypad(v)


class Slot(_Strict):
    """A typed value to collect from the caller. Its value lands in the variable of the slot's name."""
    type: SlotType = Field(description="digits, number, yes_no, date, time, currency or text")
    prompt: str | None = Field(None, description="Asked when this slot is still missing (defaults to the "
                                                 "node's prompt).")
    min_length: int = Field(1, ge=1, le=32, description="digits: fewest digits")
    max_length: int = Field(16, ge=1, le=32, description="digits: most digits")
    checksum: Literal["luhn"] | None = Field(None, description="digits: a check the digits must pass")
    min: float | None = Field(None, description="number: smallest accepted")
    max: float | None = Field(None, description="number: largest accepted")
    sensitive: bool | None = Field(None, description=SENSITIVE_DESCRIPTION + " Default: on for checksum: luhn.")
    when: Literal["future", "past", "any"] = Field(
        "future", description="date: future (an appointment: today or later; a date said without a year is "
                              "the next such day), past (a date of birth: today or earlier; without a year, "
                              "the last such day) or any")
    years: int | None = Field(None, ge=1, le=200,
                              description="date: how many years from today the date may lie (default 5 for "
                                          "future, 120 for past and any); a date out of range is not taken")
    confirm: str | None = Field(
        None, description="A read-back said once the value is heard, e.g. \"I have {born|date}. Is that right?\": "
                          "a yes goes on, a no asks for the value again, and a corrected value (\"no, the fifth "
                          "of March\") is read back in turn")
    order: Literal["mdy", "dmy", "ymd"] | None = Field(
        None, description="date: how the caller writes a numeric date such as 04/03/1985 (month first, day first "
                          "or year first). Default: from the flow's hours.timezone (month first in the United "
                          "States, day first elsewhere; month first without hours)")

    @property
    def is_sensitive(self) -> bool:
        return self.sensitive if self.sensitive is not None else self.checksum == "luhn"

    def spec(self) -> dict:
        return {"min_length": self.min_length, "max_length": self.max_length, "checksum": self.checksum,
                "min": self.min, "max": self.max, "when": self.when, "years": self.years, "order": self.order}


class _Asks(_Speaks):
    """Reprompt and turn-taking settings shared by the nodes that wait for the caller."""
    no_match: str = Field("Sorry, I didn't catch that.", description="Said before the prompt is repeated.")
    no_input: str = Field("Sorry, I didn't hear anything.", description="Said when the caller stays silent.")
    max_attempts: int = Field(3, ge=1, le=10, description="No-match or no-input tries before on_failure.")
    escalate: list[str] = Field(default_factory=list, description="Longer reprompts for the 2nd, 3rd, ... "
                                                                 "attempt, said instead of no_match/no_input.")
    timeout_s: float = Field(8.0, gt=0, le=120, description="Silence after the prompt before a no-input reprompt.")
    end_silence_ms: int = Field(700, ge=200, le=5000, description="Caller silence that ends their turn here.")
    min_confidence: float = Field(0.3, ge=0, le=1, description="A recognition less sure than this (0..1) is "
                                                                 "not acted on: the caller hears the no-match reprompt.")
    on_failure: str = Field(description="Node to go to after max_attempts of no match or no input.")


class SayNode(_Speaks):
    type: Literal["say"]
    text: str = Field(min_length=1, description="What the agent says: a template ({var}, {var|digits}).")
    pause_ms: int = Field(0, ge=0, le=10000, description="Silence after the text, before the next node.")
    next: str


def ask_rules(intents, slots, next_) -> list[str]:
    """An ask node's own rules, beyond each field's shape (also run on a node whose fields are wrong)."""
    problems = []
    if not intents and not slots:
        problems.append("an ask node needs intents or slots")
    if slots and next_ is None:
        problems.append("an ask node with slots needs next (where to go once they are filled)")
    return problems


class AskNode(_Asks):
    type: Literal["ask"]
    prompt: str = Field(min_length=1, description="The question (a template).")
    intents: dict[str, Intent] = Field(default_factory=dict)
    slots: dict[str, Slot] = Field(default_factory=dict, description="Typed values to collect; each is asked "
                                                                     "for until filled, several per utterance.")
    next: str | None = Field(None, description="With slots: the node after every slot is filled.")
    keypad_globals: bool = Field(True, description="A global intent's keypad digit (the operator's 0) pressed "
                                                   "as the first key of a digit string here goes to that "
                                                   "intent. false: every key is part of the number.")
    reask: bool = Field(True, description="Coming back to this node after it was answered asks all its slots "
                                          "again (their values are cleared); if the flow cleared some of them "
                                          "on the way back (set to ''), only those are asked. false: keep "
                                          "every value and ask only for what is missing. A value set before "
                                          "the first visit (by a webhook, a set node or the call) is used.")
    expect: Literal["auto", "speech", "yes_no", "digits"] = Field(
        "auto", description="What the caller answers here; shapes turn-taking (yes/no ends quickly, digit "
                            "strings allow pauses between groups). auto: digits if an intent takes digits, "
                            "yes_no if every example is a short yes/no phrase, else speech.")

    @model_validator(mode="after")
    def _intents_or_slots(self):
        problems = ask_rules(self.intents, self.slots, self.next)
        if problems:
            raise ValueError(problems[0])
        return self


class MenuOption(_Strict):
    key: str = Field(description="The keypad digit for this option.")
    label: str = Field(description="How the option is read out: 'For {label}, press {key}.'")
    examples: list[str] = Field(default_factory=list, description="Phrases besides the label that choose it.")
    next: str

    @field_validator("key")
    @classmethod
    def _digit(cls, v: str) -> str:
        return _keypad(v)


class MenuNode(_Asks):
    type: Literal["menu"]
    prompt: str | None = Field(None, description="Said before the options are read out.")
    options: list[MenuOption] = Field(min_length=1)

    def as_ask(self) -> AskNode:
        """A menu is an ask whose prompt reads the options out and whose intents are the options."""
        read_out = " ".join(f"For {o.label}, press {o.key}." for o in self.options)
        prompt = f"{self.prompt} {read_out}" if self.prompt else read_out
        fields = {k: getattr(self, k) for k in _Asks.model_fields}
        intents = {f"option_{o.key}": Intent(examples=[o.label, *o.examples], keypad=o.key, next=o.next)
                   for o in self.options}
        return AskNode(type="ask", prompt=prompt, intents=intents, **fields)


class Case(_Strict):
    when: str = Field(alias="if", description="A condition: comparisons, and/or/not, in, variables.")
    next: str


class BranchNode(_Strict):
    type: Literal["branch"]
    cases: list[Case] = Field(min_length=1, description="Tried in order; the first true one is taken.")
    otherwise: str = Field(alias="else", description="Node when no case is true.")


class SetNode(_Strict):
    type: Literal["set"]
    values: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, description="Variables to set; strings are templates.")
    compute: dict[str, str] = Field(default_factory=dict, description="Variables to set from expressions.")
    next: str


class SubflowNode(_Strict):
    type: Literal["subflow"]
    flow: str = Field(description="Another flow file (relative to this one) to run here; its `return` nodes "
                                  "come back to next. It shares this call's variables.")
    next: str = Field(description="The node after the sub-flow returns.")


class ReturnNode(_Strict):
    type: Literal["return"]
    text: str | None = Field(None, description="Said before going back to the calling flow (a template).")


class WebhookNode(_Speaks):
    type: Literal["webhook"]
    url: str = Field(description="http(s) URL, a template: {var} is filled in (URL-encoded).")
    method: Literal["GET", "POST"] = "GET"
    headers: dict[str, str] = Field(default_factory=dict, description="Header templates; secrets come from "
                                                                      "variables listed in the flow's env.")
    body: dict[str, str | int | float | bool | None] = Field(default_factory=dict,
                                                             description="JSON body for POST; strings are templates.")
    timeout_s: float = Field(3.0, gt=0, le=30)
    say: str | None = Field(None, description="Said while waiting (\"One moment while I look that up.\").")
    save: dict[str, str] = Field(default_factory=dict, description="variable: dotted path into the JSON reply "
                                                                   "(customer.name, items.0.id).")
    defaults: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="variable: the value to save when the reply lacks (or has null at) "
                                          "that variable's path.")
    next: str = Field(description="Node after a reply that has every saved field (or its default).")
    on_failure: str = Field(description="Node when the request fails, times out or returns no JSON.")
    on_missing: str | None = Field(None, description="Node when the reply lacks a saved field that has no "
                                                     "default; without it, on_failure. A missing value is never "
                                                     "spoken as blank text.")

    @model_validator(mode="after")
    def _defaults_are_saved(self):
        unknown = sorted(set(self.defaults) - set(self.save))
        if unknown:
            raise ValueError(f"defaults for variables the node does not save: {', '.join(unknown)}")
        return self

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not re.match(r"^(https?://|\{)", v):
            raise ValueError(f"url must start with http:// or https:// (or a variable), got {v!r}")
        return v


class LlmChoice(_Strict):
    description: str = Field(description="What this choice means, for the model and for clarifying questions.")
    examples: list[str] = Field(default_factory=list)
    next: str


class LlmTool(_Strict):
    type: Literal["transfer", "end_call"]
    description: str = ""
    to: str | None = Field(None, description="transfer: the only destination this tool reaches.")

    @field_validator("to")
    @classmethod
    def _sip_uri(cls, v: str | None) -> str | None:
        return _uri(v)

    @model_validator(mode="after")
    def _needs_to(self):
        if self.type == "transfer" and not self.to:
            raise ValueError("a transfer tool needs to (a SIP URI)")
        return self


class LlmNode(_Asks):
    type: Literal["llm"]
    provider: str = Field("default", description="A provider named under the flow's llm (default: offline).")
    prompt: str | None = Field(None, description="Said when the node starts (a template).")
    instructions: str = Field("You are a helpful contact-center agent. Keep answers to one or two short "
                              "sentences.", description="System instructions for the model.")
    knowledge: str | None = Field(None, description="Facts the agent may answer from.")
    choices: dict[str, LlmChoice] = Field(default_factory=dict, description="Where the conversation may go.")
    slots: dict[str, Slot] = Field(default_factory=dict, description="Values to extract into variables.")
    tools: dict[str, LlmTool] = Field(default_factory=dict, description="The only actions the model may take.")
    max_turns: int = Field(3, ge=1, le=20, description="Caller turns before on_failure.")
    time_budget_s: float = Field(4.0, gt=0, le=60, description="After this the caller hears the fallback.")
    fallback: str = Field("Sorry, I'm having trouble with that. Let me get you some help.",
                          description="Said when the model fails or runs out of time.")
    acknowledgements: list[str] = Field(
        ["Let me see.", "One moment.", "Let me check that."], max_length=10,
        description="The offline model (local-llm, or local's hybrid) says one of these, in turn, as soon as it "
                    "takes a turn, because its own first words take a second or more on a CPU. [] for silence.")
    next: str | None = Field(None, description="Node after an answer when there are no choices.")


QUEUE_STRATEGIES = ("longest_idle", "round_robin", "ring_all")
AGENT_NAME = re.compile(r"^[A-Za-z0-9._+-]{1,64}$")


class QueueSettings(_Strict):
    """A queue of callers waiting for human agents (the agents themselves are in the server's
    config, `contact_center.agents`, shared by every worker)."""
    agents: list[str] = Field(default_factory=list, description="Agents (by name) who take this queue's calls.")
    skills: list[str] = Field(default_factory=list, description="...and any agent with one of these skills.")
    strategy: Literal["longest_idle", "round_robin", "ring_all"] = Field(
        "longest_idle", description="longest_idle: the free agent idle longest; round_robin: the free agent rung "
                                    "least recently; ring_all: every free agent at once, the first to answer "
                                    "takes the call.")
    ring_timeout_s: float = Field(15, ge=3, le=120, description="How long one agent's phone rings before the "
                                                                "next agent is tried.")
    wrap_up_s: float = Field(10, ge=0, le=600, description="After a call the agent gets this long before the next.")
    music: str = Field("generated", description="Hold music: 'generated' (made here, band-limited for the "
                                                "phone line) or a WAV file relative to the flow file.")
    announce_every_s: float = Field(30, ge=0, le=600, description="Position and expected wait are announced "
                                                                  "this often (0: never); the first on joining.")
    announcement: str = Field("You are number {queue_position} in line. The expected wait is about "
                              "{queue_wait_minutes} minutes.", description="A template; queue_position and "
                                                                           "queue_wait_minutes are set.")
    max_wait_s: float = Field(300, ge=5, le=7200, description="After this the caller goes to the transfer "
                                                              "node's on_timeout (or on_failure).")
    service_level_s: float = Field(20, ge=1, le=3600, description="Calls answered within this count toward "
                                                                  "the service level the console shows.")
    callback_key: str | None = Field("1", description="A key the caller may press to leave the queue for the "
                                                      "transfer node's on_callback (none: off).")
    callback_offer: str = Field("Or press 1 at any time to leave your number, and we will call you back.",
                                description="Said after the first announcement when callback_key is set.")
    callback_intro: str = Field("Hello, we are calling you back, as you asked. Please hold: you are next in line.",
                                description="Said when a callback is dialled and answered, before the caller waits "
                                            "at the head of the queue for the agent who is free.")
    callback_attempts: int = Field(3, ge=1, le=10, description="Calls made to reach a caller who asked for a "
                                                              "callback (no answer, busy, a machine: tried again).")
    callback_retry_s: float = Field(300, ge=5, le=86400, description="Seconds between those calls.")
    whisper: str = Field("A caller for {queue}. {triage}", description="Spoken to the agent alone when they "
                                                                     "answer, before the caller is connected "
                                                                     "(a template; triage: intent and slots).")

    _key = field_validator("callback_key")(lambda cls, v: _keypad(v))

    @field_validator("agents")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not AGENT_NAME.match(name):
                raise ValueError(f"agent name {name!r}: letters, digits and . _ + - only")
        return v

    @model_validator(mode="after")
    def _someone(self):
        if not self.agents and not self.skills:
            raise ValueError("a queue needs agents or skills (who answers it?)")
        return self


class TransferNode(_Speaks):
    type: Literal["transfer"]
    text: str | None = Field(None, description="Announced to the caller before the transfer (a template).")
    to: str | None = Field(None, description="SIP URI to transfer the caller to (blind transfer with REFER).")
    queue: str | None = Field(None, description="A queue named in the flow's queues, instead of to.")
    mode: Literal["blind", "warm"] = Field(
        "blind", description="blind: SIP REFER, the caller's phone calls the destination. warm: the agent calls "
                             "the destination, speaks the summary to the person who answers, then bridges the "
                             "caller to them (the agent stays in the media path and keeps recording).")
    summary: str = Field("I have a caller on the line. They said: {last_utterance}",
                         description="warm: what the agent tells the person before bridging (a template).")
    ring_s: float = Field(20, gt=0, le=120, description="warm: how long to wait for the person to answer.")
    on_failure: str | None = Field(None, description="Node when the transfer fails (refused, no answer; "
                                                     "default: hang up).")
    on_timeout: str | None = Field(None, description="A queue of agents: node after the queue's max_wait_s "
                                                     "(voicemail, a callback offer, another queue); default "
                                                     "on_failure.")
    on_callback: str | None = Field(None, description="A queue of agents: node when the caller presses the "
                                                      "queue's callback_key (e.g. ask for a number, then "
                                                      "hang up); default on_failure.")

    @field_validator("to")
    @classmethod
    def _sip_uri(cls, v: str | None) -> str | None:
        return _uri(v)

    @model_validator(mode="after")
    def _one_target(self):
        if (self.to is None) == (self.queue is None):
            raise ValueError("a transfer needs exactly one of to or queue")
        return self


class VoicemailNode(_Speaks):
    type: Literal["voicemail"]
    prompt: str = Field("Please leave a message after the tone. Press pound when you are done.")
    max_s: float = Field(60, ge=3, le=600, description="Longest message.")
    end_silence_s: float = Field(4.0, ge=1, le=30, description="Silence that ends the message.")
    beep: bool = True
    next: str


class HangupNode(_Speaks):
    type: Literal["hangup"]
    text: str | None = None


Node = Annotated[Union[SayNode, AskNode, MenuNode, BranchNode, SetNode, WebhookNode, LlmNode, TransferNode,
                       VoicemailNode, HangupNode, SubflowNode, ReturnNode], Field(discriminator="type")]
WAITS_FOR_CALLER = (AskNode, MenuNode, LlmNode, VoicemailNode)
ENDS_CALL = (TransferNode, HangupNode)


class GlobalIntent(_Strict):
    examples: list[str] = Field(default_factory=list)
    keypad: str | None = None
    next: str

    @field_validator("keypad")
    @classmethod
    def _digit(cls, v: str | None) -> str | None:
        return _keypad(v)


class Globals(_Strict):
    intents: dict[str, GlobalIntent] = Field(default_factory=dict, description="Heard at every node that waits "
                                                                                "for the caller (operator, 0).")
    max_no_match: int | None = Field(None, ge=1, description="No-matches in the whole call before on_no_match.")
    on_no_match: str | None = None
    max_no_input: int | None = Field(None, ge=1, description="Silent turns in the whole call before on_no_input.")
    on_no_input: str | None = None


DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_SPAN = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def _days(spec: str) -> list[int]:
    """"mon-fri", "sat,sun", "wed" → weekday numbers (Monday 0)."""
    out: list[int] = []
    for part in spec.lower().replace(" ", "").split(","):
        first, _, last = part.partition("-")
        if first not in DAY_NAMES or (last and last not in DAY_NAMES):
            raise ValueError(f"{spec!r}: days are mon, tue, wed, thu, fri, sat, sun, as 'mon-fri' or 'sat,sun'")
        a, b = DAY_NAMES.index(first), DAY_NAMES.index(last or first)
        out += [d % 7 for d in range(a, b + 1 if b >= a else b + 8)]
    return out


def _minutes(span: str) -> tuple[int, int]:
    m = _SPAN.match(span)
    if not m:
        raise ValueError(f"{span!r}: opening times are written 09:00-17:30")
    h1, m1, h2, m2 = map(int, m.groups())
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if not (0 <= start < end <= 24 * 60 and m1 < 60 and m2 < 60):
        raise ValueError(f"{span!r}: the opening must be before the closing, within one day (00:00-24:00)")
    return start, end


class Hours(_Strict):
    """When the contact center is open, in its own time zone (not the server's)."""

    timezone: str = Field(description="IANA time zone, e.g. Europe/London or America/New_York; hour, "
                                      "minute, weekday, date and time are read in it.")
    open: dict[str, str | list[str]] = Field(default_factory=dict, validate_default=True, description=(
        "Days -> opening times: {mon-fri: '09:00-17:30', sat: ['10:00-12:00', '13:00-16:00']}. Days not "
        "named are closed."))
    holidays: list[dt.date] = Field(default_factory=list, description="Dates closed all day (YYYY-MM-DD).")

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r} (IANA names, e.g. Europe/London)") from None
        return v

    @field_validator("open")
    @classmethod
    def _spans(cls, v: dict) -> dict:
        if not v:
            raise ValueError("hours without open: times are closed every day; name them, e.g. "
                             "open: {mon-fri: '09:00-17:30'}")
        for days, spans in v.items():
            _days(days)
            for span in [spans] if isinstance(spans, str) else spans:
                _minutes(span)
        return v

    def zone(self):
        import zoneinfo

        return zoneinfo.ZoneInfo(self.timezone)

    def is_open(self, when: dt.datetime) -> bool:
        """`when` in this time zone: inside an opening time, and not a holiday."""
        if when.date() in self.holidays:
            return False
        minute = when.hour * 60 + when.minute
        for days, spans in self.open.items():
            if when.weekday() in _days(days):
                for span in [spans] if isinstance(spans, str) else spans:
                    start, end = _minutes(span)
                    if start <= minute < end:
                        return True
        return False


class Trouble(_Strict):
    """What the caller hears when a part of the agent fails (the recognizer raises or stalls, the voice
    and its backup cannot speak, a stage crashes): a sentence within a second, then a transfer to a
    person or, without one, a request to call back and goodbye."""
    say: str = "I'm sorry, we're having technical trouble."
    transfer_to: str | None = Field(None, description="a SIP URI or a queue name; none: ask to call back")
    call_back: str = "Please call us back in a few minutes. Goodbye."
    transferring: str = "Let me put you through to a colleague."


class AfterCallField(_Strict):
    """One field the post-call work fills for this flow's calls, by a rule (exactly one of `from`,
    `when`, `phrases`). It goes into the call's row (`after_call`) and the end-of-call webhook."""
    description: str = Field(description="What the field means, for whoever reads the row or the webhook.")
    type: Literal["text", "yes_no", "number"] = "text"
    from_: str | None = Field(None, alias="from", description="a variable (a slot, a webhook's result, a built-in) "
                                                             "whose value at the end of the call fills it")
    when: str | None = Field(None, description="a condition over the call's variables and `outcome` (the store's "
                                               "outcome word): yes or no")
    phrases: list[str] = Field(default_factory=list, description="yes when the caller said any of these")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _one_rule(self) -> "AfterCallField":
        rules = [r for r in ("from", "when", "phrases") if getattr(self, "from_" if r == "from" else r)]
        if len(rules) != 1:
            raise ValueError(f"give exactly one of from, when, phrases (got {', '.join(rules) or 'none'})")
        if (self.when or self.phrases) and self.type != "yes_no":
            raise ValueError("a `when` or `phrases` field is yes or no: type: yes_no")
        return self


class AfterCall(_Strict):
    """What the post-call work adds to this flow's calls, besides the summary: fields, and phrase
    categories (a category when the caller said one of its phrases)."""
    fields: dict[str, AfterCallField] = Field(default_factory=dict, description="name: {description, type, and "
                                                                             "one rule: from, when or phrases}")
    categories: dict[str, list[str]] = Field(default_factory=dict, description="category: the caller's phrases "
                                                                                "that put a call in it")

    @field_validator("fields", "categories")
    @classmethod
    def _names(cls, v: dict) -> dict:
        for name in v:
            if not VAR_NAME.match(name):
                raise ValueError(f"{name!r}: letters, digits and _, not starting with a digit")
        return v


class VoicemailDrop(_Strict):
    """The message a dialled call leaves on an answering machine, after its beep (or the end of its
    greeting where there is none); then the call hangs up."""
    text: str = Field(description="What is said (variables in braces, as in prompts).")
    audio: str | None = Field(None, description="A recorded prompt (a WAV file, relative to the flow file) "
                                                "played instead; the text is what transcripts show.")


def trouble_destination(flow: "Flow") -> str | None:
    """The SIP URI trouble transfers to (a queue of agents needs a working voice and recognizer to
    wait in, so trouble never goes to one; the checker refuses it)."""
    to = flow.trouble.transfer_to
    to = flow.queues.get(to, to) if to is not None else None
    return to if isinstance(to, str) else None


class LlmProviderConfig(_Strict):
    kind: Literal["local", "local-llm", "openai", "anthropic", "bedrock"] = Field(
        "local", description="local: offline (sentence embeddings and rules, no key, no network; with the "
                             "offline model built, unclear turns go to it: `callcenter llm build`); local-llm: "
                             "every turn to the offline model (Qwen2.5-Coder-1.5B int8 on the CPU); openai: any "
                             "OpenAI-compatible chat completions server (vLLM, Ollama, llama.cpp, OpenAI); "
                             "anthropic: the Messages API; bedrock: AWS Bedrock ConverseStream (optional extra).")
    model: str | None = None
    base_url: str | None = Field(None, description="e.g. http://127.0.0.1:11434/v1 for Ollama")
    api_key_env: str | None = Field(None, description="Environment variable holding the key (never logged).")
    max_tokens: int = Field(200, ge=1, le=4096)
    region: str | None = Field(None, description="bedrock: the AWS region (default: from the environment)")


class Flow(_Strict):
    # what the checker warns about (file:line:col: warning: ...), filled by load_flow; not in the file
    warnings: ClassVar[list[str]] = []
    # the files this flow was loaded from: itself and its sub-flows (hot reload watches them all)
    sources: ClassVar[list[Path]] = []
    name: str
    version: int = 1
    voice: VoiceSettings = Field(default_factory=VoiceSettings,
                                 description="Voice for the whole flow: a name (ssm:heart — the default, ssm:reed, ssm:kumo, "
                                             "ssm:allison, espeak:en-us) or {name, speed, pitch}.")
    ambience: AmbienceSettings = Field(default_factory=AmbienceSettings,
                                       description="Phone-line ambience: a preset (clean, office, callcenter, "
                                                   "mobile) or {preset, enabled, hiss_db, bed_db, ...}.")
    variables: dict[str, str | int | float | bool | None] = Field(default_factory=dict,
                                                                  description="Variables and their starting values.")
    env: list[str] = Field(default_factory=list, description="Environment variables readable as variables "
                                                             "(API tokens for webhooks); never logged.")
    queues: dict[str, str | QueueSettings] = Field(
        default_factory=dict, description="Named transfer destinations: a SIP URI, or a queue of human agents "
                                          "(hold music, announcements, agents rung by strategy).")
    llm: dict[str, LlmProviderConfig] = Field(default_factory=lambda: {"default": LlmProviderConfig()},
                                              description="LLM providers by name; llm nodes pick one.")
    hours: Hours | None = Field(None, description="Opening hours and holidays in a time zone; conditions read "
                                                  "open, closed and holiday.")
    globals: Globals = Field(default_factory=Globals)
    trouble: Trouble = Field(default_factory=Trouble)
    machine_detection: bool = Field(True, description=(
        "On a call the server dials: tell a person from an answering machine as the greeting is heard "
        "(`amd` reads person, machine or unknown). The flow starts as soon as the greeting sounds like a "
        "person's; a machine stops it and gets the voicemail_drop message, or a hang-up."))
    after_call: AfterCall = Field(default_factory=AfterCall, description=(
        "Fields the post-call work fills for each call (reason, product, follow-up needed...) by rules, and "
        "phrase categories; they go into the call's row and the end-of-call webhook."))
    voicemail_drop: VoicemailDrop | None = Field(None, description=(
        "The message left on an answering machine: text, or {text, audio}. None: hang up on a machine."))
    start: str
    nodes: dict[str, Node] = Field(min_length=1)

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, v):
        return _as_voice(v) if v is not None else VoiceSettings()

    @field_validator("voicemail_drop", mode="before")
    @classmethod
    def _drop(cls, v):
        return VoicemailDrop(text=v) if isinstance(v, str) else v

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

    @field_validator("queues")
    @classmethod
    def _queues(cls, v: dict) -> dict:
        for uri in v.values():
            if isinstance(uri, str):
                _uri(uri)
        return v

    @field_validator("llm")
    @classmethod
    def _default_provider(cls, v: dict) -> dict:
        return {"default": LlmProviderConfig(), **v}

    @model_validator(mode="after")
    def _date_order(self) -> "Flow":
        """Date slots without an `order` read numeric dates as callers in the flow's time zone write them."""
        from callcenter.dialog.slots import date_order_for

        order = date_order_for(self.hours.timezone if self.hours else None)
        for node in self.nodes.values():
            for slot in (getattr(node, "slots", None) or {}).values():
                if slot.type == "date" and slot.order is None:
                    slot.order = order
        return self


# ------------------------------------------------------------------ checking
def targets(node) -> list[tuple[tuple, str]]:
    """(key path inside the node, target node name) for every reference a node makes."""
    refs: list[tuple[tuple, str]] = []
    for key in ("next", "on_failure", "on_missing", "on_timeout", "on_callback"):
        target = getattr(node, key, None)
        if isinstance(target, str):
            refs.append(((key,), target))
    if isinstance(node, AskNode):
        refs += [(("intents", name, "next"), i.next) for name, i in node.intents.items()]
    elif isinstance(node, MenuNode):
        refs += [(("options", i, "next"), o.next) for i, o in enumerate(node.options)]
    elif isinstance(node, BranchNode):
        refs += [(("cases", i, "next"), c.next) for i, c in enumerate(node.cases)] + [(("else",), node.otherwise)]
    elif isinstance(node, LlmNode):
        refs += [(("choices", name, "next"), c.next) for name, c in node.choices.items()]
    return refs


def defined_variables(flow: Flow) -> set[str]:
    """Every variable a flow can have: builtins, declared, env, slots, captures, saves and sets."""
    names = set(BUILTIN_VARIABLES) | set(flow.variables) | set(flow.env)
    for node in flow.nodes.values():
        if isinstance(node, (AskNode, LlmNode)):
            names |= set(node.slots)
        if isinstance(node, AskNode):
            names |= {i for i, intent in node.intents.items() if intent.digits}
        elif isinstance(node, SetNode):
            names |= set(node.values) | set(node.compute)
        elif isinstance(node, WebhookNode):
            names |= set(node.save)
    return names


def sensitive_variables(flow: Flow) -> set[str]:
    """The variables that hold sensitive values: `sensitive` slots (luhn ones by default) and digit
    intents."""
    names: set[str] = set()
    for node in flow.nodes.values():
        if isinstance(node, AskNode):
            names |= {n for n, slot in node.slots.items() if slot.is_sensitive}
            names |= {n for n, intent in node.intents.items() if intent.digits and intent.digits.sensitive}
        elif isinstance(node, LlmNode):
            names |= {n for n, slot in node.slots.items() if slot.is_sensitive}
    return names


def trusted_variables(flow: Flow) -> set[str]:
    """Variables only the flow's author sets (declared `variables` and `env`, and never the target of
    a slot, capture, webhook save or set node): the only ones a webhook URL may take its scheme and
    host from. A value a caller filled in must never choose where a request goes."""
    written: set[str] = set()
    for node in flow.nodes.values():
        if isinstance(node, (AskNode, LlmNode)):
            written |= set(node.slots)
        if isinstance(node, AskNode):
            written |= set(node.intents)
        elif isinstance(node, SetNode):
            written |= set(node.values) | set(node.compute)
        elif isinstance(node, WebhookNode):
            written |= set(node.save)
    return (set(flow.variables) | set(flow.env)) - written


def url_authority_names(url: str) -> list[str]:
    """The placeholders of a URL template that stand in its scheme or host part (before the first
    `/` of the path): `{base}/x` → [base], `http://{host}/x` → [host]."""
    start = url.find("://")
    cut = url.find("/", start + 3 if start >= 0 else 0)
    head = url if cut < 0 else url[:cut]
    try:
        return [ph.name for ph in template_names(head)]
    except ExprError:
        return []


def _templates(node) -> list[tuple[tuple, str]]:
    out: list[tuple[tuple, str]] = []
    for key in ("text", "prompt", "no_match", "no_input", "url", "say", "fallback", "summary"):
        value = getattr(node, key, None)
        if isinstance(value, str):
            out.append(((key,), value))
    for i, text in enumerate(getattr(node, "escalate", []) or []):
        out.append((("escalate", i), text))
    if isinstance(node, AskNode):
        out += [(("slots", n, "prompt"), s.prompt) for n, s in node.slots.items() if s.prompt]
        out += [(("slots", n, "confirm"), s.confirm) for n, s in node.slots.items() if s.confirm]
    if isinstance(node, WebhookNode):
        out += [(("headers", k), v) for k, v in node.headers.items()]
        out += [(("body", k), v) for k, v in node.body.items() if isinstance(v, str)]
    if isinstance(node, SetNode):
        out += [(("values", k), v) for k, v in node.values.items() if isinstance(v, str)]
    return out


SPOKEN_FIELDS = ("text", "prompt", "no_match", "no_input", "say", "fallback")


def spoken_prompts(flow: "Flow") -> list[tuple[str, VoiceSettings]]:
    """The sentences this flow says to callers word for word (no `{variable}` in them), each with
    its voice: what the agent can synthesise before the first caller needs them."""
    out: list[tuple[str, VoiceSettings]] = []
    for node in flow.nodes.values():
        voice = getattr(node, "voice", None) or flow.voice
        for path, text in _templates(node):
            if path[0] in SPOKEN_FIELDS + ("escalate", "slots") and "{" not in text:
                out.append((text, voice))
    t = flow.trouble
    out += [(text, flow.voice) for text in (t.say, t.call_back, t.transferring) if "{" not in text]
    return list(dict.fromkeys(out))


def _expressions(node) -> list[tuple[tuple, str]]:
    if isinstance(node, BranchNode):
        return [(("cases", i, "if"), c.when) for i, c in enumerate(node.cases)]
    if isinstance(node, SetNode):
        return [(("compute", k), v) for k, v in node.compute.items()]
    return []


def _check_phrases(prefix: tuple, intents: dict, problems: list) -> None:
    seen_digit: dict[str, str] = {}
    seen_phrase: dict[str, str] = {}
    for iname, intent in intents.items():
        keypad = getattr(intent, "keypad", None)
        if keypad is not None:
            if keypad in seen_digit:
                problems.append((prefix + (iname, "keypad"), f"keypad {keypad} already selects {seen_digit[keypad]!r}"))
            seen_digit[keypad] = iname
        for i, phrase in enumerate(intent.examples):
            key = " ".join(phrase.lower().split())
            if key in seen_phrase and seen_phrase[key] != iname:
                problems.append((prefix + (iname, "examples", i),
                                 f"phrase {phrase!r} is also an example of {seen_phrase[key]!r}"))
            seen_phrase.setdefault(key, iname)


def _check_ask(name: str, node: AskNode, problems: list) -> None:
    digit_intents = [i for i, x in node.intents.items() if x.digits]
    if len(digit_intents) > 1:
        problems.append((("nodes", name, "intents", digit_intents[1], "digits"),
                         f"only one intent per node may take digits ({digit_intents[0]!r} does)"))
    if digit_intents and any(x.keypad for x in node.intents.values()):
        problems.append((("nodes", name, "intents"),
                         "keypad options and a digits intent in one node: keys go to the digit string"))
    for iname, intent in node.intents.items():
        if not intent.examples and intent.keypad is None and intent.digits is None:
            problems.append((("nodes", name, "intents", iname), "intent has no examples, keypad or digits"))
        if intent.digits and intent.digits.min_length > intent.digits.max_length:
            problems.append((("nodes", name, "intents", iname, "digits"), "min_length is greater than max_length"))
        if intent.digits and intent.keypad is not None:
            problems.append((("nodes", name, "intents", iname, "keypad"),
                             "a digits intent collects keypad digits itself; drop keypad"))
    for sname, slot in node.slots.items():
        if not VAR_NAME.match(sname):
            problems.append((("nodes", name, "slots", sname), f"slot name {sname!r} must be a variable name"))
        if slot.min_length > slot.max_length:
            problems.append((("nodes", name, "slots", sname), "min_length is greater than max_length"))
    if node.slots and node.intents and sum(s.type == "digits" for s in node.slots.values()) and \
            any(i.keypad for i in node.intents.values()):
        problems.append((("nodes", name, "slots"), "keypad options and a digits slot in one node"))
    _check_phrases(("nodes", name, "intents"), node.intents, problems)


def yes_no_compared(expr, slots: set[str]) -> list[str]:
    """Yes/no slots an expression compares with a string (`order == 'yes'`: always false, since the
    slot holds true or false)."""
    import ast

    out = []
    for node in ast.walk(expr.tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = [s.id for s in sides if isinstance(s, ast.Name) and s.id in slots]
            if names and any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                out += names
    return sorted(set(out))


def check_flow(flow: Flow, subflow: bool = False, extra_variables: set[str] = frozenset(),
               whole: bool = True) -> list[tuple[tuple, str]]:
    """Problems a valid-shaped flow can still have, as (key path, message). `subflow`: the file is
    run by another flow's `subflow` node, so its `return` nodes have somewhere to go."""
    problems: list[tuple[tuple, str]] = []
    if not subflow:
        problems += [(("nodes", n, "type"), "return is only for a flow that another flow runs as a subflow")
                     for n, node in flow.nodes.items() if isinstance(node, ReturnNode)]
    problem = voice_problem(flow.voice.name)
    if problem:
        problems.append((("voice",), problem))
    if flow.start not in flow.nodes:
        problems.append((("start",), f"start node {flow.start!r} is not defined"))
    to = flow.trouble.transfer_to
    if to is not None and to not in flow.queues and not re.match(r"^(sips?|tel):", to):
        problems.append((("trouble", "transfer_to"), f"{to!r} is neither a SIP URI nor one of the flow's queues"))
    elif to is not None and isinstance(flow.queues.get(to), QueueSettings):
        problems.append((("trouble", "transfer_to"), f"{to!r} is a queue of agents: trouble needs a SIP URI "
                                                       "(a caller cannot wait in a queue while the agent is failing)"))

    known = defined_variables(flow) | set(extra_variables)
    sensitive = sensitive_variables(flow)
    yes_no_slots = {n for node in flow.nodes.values() for n, slot in (getattr(node, "slots", None) or {}).items()
                    if slot.type == "yes_no"}
    trusted = trusted_variables(flow)
    for fname, f in flow.after_call.fields.items():
        where = ("after_call", "fields", fname)
        if f.from_ is not None:
            if f.from_ not in known:
                problems.append((where + ("from",), f"unknown variable {f.from_!r}{did_you_mean(f.from_, known)}"))
            elif f.from_ in sensitive:
                problems.append((where + ("from",), f"{f.from_!r} is sensitive (a card number): it never leaves the call"))
        if f.when is not None:
            try:
                for var in sorted(parse_expr(f.when).names - known - {"outcome"}):
                    problems.append((where + ("when",), f"unknown variable {var!r} in condition {f.when!r}"
                                                        f"{did_you_mean(var, known)}"))
            except ExprError as exc:
                problems.append((where + ("when",), str(exc)))
    if flow.voicemail_drop is not None:
        try:
            for ph in template_names(flow.voicemail_drop.text):
                if ph.name not in known:
                    problems.append((("voicemail_drop",), f"unknown variable {ph.name!r} in template"
                                                          f"{did_you_mean(ph.name, known)}"))
        except ExprError as exc:
            problems.append((("voicemail_drop",), str(exc)))
    for name, node in flow.nodes.items():
        if getattr(node, "voice", None) is not None and (problem := voice_problem(node.voice.name)):
            problems.append((("nodes", name, "voice"), problem))
        for sub, target in targets(node):
            if target not in flow.nodes:
                problems.append((("nodes", name) + sub, f"unknown node {target!r}{did_you_mean(target, flow.nodes)}"))
        for sub, text in _templates(node):
            try:
                for ph in template_names(text):
                    if ph.name not in known:
                        problems.append((("nodes", name) + sub, f"unknown variable {ph.name!r} in template"
                                                                f"{did_you_mean(ph.name, known)}"))
            except ExprError as exc:
                problems.append((("nodes", name) + sub, str(exc)))
        for sub, source in _expressions(node):
            try:
                expr = parse_expr(source)
                for var in sorted(expr.names - known):
                    problems.append((("nodes", name) + sub, f"unknown variable {var!r} in condition {source!r}"
                                                            f"{did_you_mean(var, known)}"))
                for var in yes_no_compared(expr, yes_no_slots):
                    problems.append((("nodes", name) + sub, f"{var!r} is a yes/no slot, true or false, never a word: "
                                                            f"write `if: {var}` or `if: not {var}`"))
            except ExprError as exc:
                problems.append((("nodes", name) + sub, str(exc)))
        for i, var in enumerate(getattr(node, "reveal", None) or []):
            if var not in sensitive:
                problems.append((("nodes", name, "reveal", i), f"{var!r} is not a sensitive slot or digit intent"))
        if isinstance(node, WebhookNode):
            for var in url_authority_names(node.url):
                if var not in trusted:
                    problems.append((("nodes", name, "url"),
                                     f"{{{var}}} stands in the URL's scheme or host, but callers or the flow can "
                                     f"set it: only a declared variable or env value may choose the host"))
        if isinstance(node, AskNode):
            _check_ask(name, node, problems)
        elif isinstance(node, MenuNode):
            keys = [o.key for o in node.options]
            for i, key in enumerate(keys):
                if key in keys[:i]:
                    problems.append((("nodes", name, "options", i, "key"), f"key {key} is used twice"))
        elif isinstance(node, LlmNode):
            if node.provider not in flow.llm:
                problems.append((("nodes", name, "provider"),
                                 f"unknown provider {node.provider!r} (the flow's llm defines "
                                 f"{', '.join(sorted(flow.llm))})"))
            if not node.choices and not node.next:
                problems.append((("nodes", name), "an llm node needs choices or next"))
            _check_phrases(("nodes", name, "choices"), node.choices, problems)
        elif isinstance(node, TransferNode) and node.queue is not None and node.queue not in flow.queues:
            problems.append((("nodes", name, "queue"), f"unknown queue {node.queue!r}{did_you_mean(node.queue, flow.queues)}"))
        if isinstance(node, (AskNode, MenuNode, LlmNode)):
            for gname, g in flow.globals.intents.items():
                local = [i.keypad for i in getattr(node, "intents", {}).values()] + \
                        [o.key for o in getattr(node, "options", [])]
                if g.keypad and g.keypad in local:
                    problems.append((("nodes", name), f"keypad {g.keypad} is taken by the global intent "
                                                      f"{gname!r} everywhere"))
    g = flow.globals
    for gname, intent in g.intents.items():
        if intent.next not in flow.nodes:
            problems.append((("globals", "intents", gname, "next"),
                             f"unknown node {intent.next!r}{did_you_mean(intent.next, flow.nodes)}"))
        if not intent.examples and not intent.keypad:
            problems.append((("globals", "intents", gname), "global intent has no examples or keypad"))
    for count, target in (("max_no_match", "on_no_match"), ("max_no_input", "on_no_input")):
        node_name = getattr(g, target)
        if (getattr(g, count) is None) != (node_name is None):
            problems.append((("globals",), f"{count} and {target} go together"))
        if node_name is not None and node_name not in flow.nodes:
            problems.append((("globals", target), f"unknown node {node_name!r}{did_you_mean(node_name, flow.nodes)}"))
    if whole:  # with a node left out for its shape, what it would lead to is unknown
        problems += _reachability(flow) + _silent_cycles(flow)
    return problems


def did_you_mean(name: str, known) -> str:
    """" (did you mean 'confirm'?)" for a near miss, else ""."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _reachability(flow: Flow) -> list[tuple[tuple, str]]:
    """Nodes no path from the start reaches. A misspelt target counts as the node it almost names
    (its own error says so), and a node that only other unreachable nodes lead to is named in their
    line, not on a line of its own: one mistake, one line."""
    if flow.start not in flow.nodes:
        return []
    g = flow.globals

    def resolve(target: str) -> str | None:
        if target in flow.nodes:
            return target
        close = difflib.get_close_matches(target, list(flow.nodes), n=1, cutoff=0.6)
        return close[0] if close else None

    def reach(roots: list[str]) -> set[str]:
        seen: set[str] = set()
        todo = [r for r in (resolve(t) for t in roots) if r]
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            todo.extend(r for r in (resolve(t) for _, t in targets(flow.nodes[n])) if r)
        return seen

    seen = reach([flow.start] + [i.next for i in g.intents.values()] + [n for n in (g.on_no_match, g.on_no_input) if n])
    lost = [name for name in flow.nodes if name not in seen]
    led_to = {t for n in lost for _, t in targets(flow.nodes[n]) if t != n}
    roots = [n for n in lost if n not in led_to] or lost[:1]  # a closed loop of lost nodes: name one
    out, named = [], set()
    for name in roots:
        follow = sorted((reach([name]) & set(lost)) - {name} - named)
        named.update(follow)
        tail = f" (and so are {', '.join(repr(f) for f in follow)}, which only it leads to)" if follow else ""
        out.append((("nodes", name), f"node {name!r} is unreachable from start {flow.start!r}{tail}"))
    for name in lost:  # lost nodes in loops that no root leads to
        if name not in named and name not in roots:
            out.append((("nodes", name), f"node {name!r} is unreachable from start {flow.start!r}"))
    return out


def _silent_cycles(flow: Flow) -> list[tuple[tuple, str]]:
    """A loop of nodes none of which waits for the caller would spin forever."""
    silent = {n for n, node in flow.nodes.items() if not isinstance(node, WAITS_FOR_CALLER + ENDS_CALL)}
    edges = {n: [t for _, t in targets(flow.nodes[n]) if t in silent] for n in silent}
    problems, state = [], {}

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        stack.append(n)
        for t in edges[n]:
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                problems.append((("nodes", t), "a cycle without any caller input: " + " -> ".join(cycle)))
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(silent):
        if n not in state:
            visit(n, [])
    return problems


def load_flow(path: str | Path) -> Flow:
    """Load and check a flow file and the sub-flows it calls; raise UserFileError listing every
    problem as file:line:col (in the file where it is)."""
    path = Path(path)
    return _load(path, (), _Budget(path))


SUBFLOW_SEP = "/"  # a sub-flow's nodes are named "<calling node>/<its node>" in the call's path
MAX_SUBFLOW_DEPTH = 8


MAX_FLOW_NODES = 2000  # nodes of a flow with all its sub-flows inlined (a diamond of sub-flows doubles them)
MAX_LOAD_S = 10.0  # loading a flow and its sub-flows may take this long at most
MAX_FLOW_FILE_BYTES = 1_000_000  # a sub-flow file


class _Budget:
    """What loading one flow may spend: nodes inlined and seconds, so that a diamond of sub-flows
    (each calling the next twice) fails at once with a clear error instead of loading for ever."""

    def __init__(self, path: Path):
        import time

        self.path, self.nodes, self._clock = path, 0, time.monotonic
        self.deadline = self._clock() + MAX_LOAD_S

    def spend(self, nodes: int, where: str) -> None:
        self.nodes += nodes
        if self.nodes > MAX_FLOW_NODES:
            raise UserFileError([f"{where}: with its sub-flows the flow has more than {MAX_FLOW_NODES} nodes "
                                 "(sub-flows that call each other more than once?)"])
        if self._clock() > self.deadline:
            raise UserFileError([f"{where}: loading took more than {MAX_LOAD_S:.0f} s (sub-flows that call "
                                 "each other more than once?)"])
MAX_AUDIO_FILE_BYTES = 20_000_000  # a recorded prompt (a minute of 16-bit 48 kHz stereo is 11.5 MB)


def confined_file(base: Path, name: str, max_bytes: int, what: str = "file") -> Path:
    """`name` (from a flow file) as a regular file inside the flow's folder `base`: no absolute path,
    no `..`, no link out of the folder, no device or FIFO, at most `max_bytes`. ValueError says
    why not (never what the file holds)."""
    import os
    import stat

    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ValueError("must be a path inside the flow's folder (no absolute path, no ..)")
    real = (base / name).resolve()
    if not real.is_relative_to(base.resolve()):
        raise ValueError("leads out of the flow's folder (through a link)")
    try:
        info = os.stat(real)
    except OSError:
        raise ValueError(f"no such {what}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("is not a regular file")
    if info.st_size > max_bytes:
        raise ValueError(f"is larger than {max_bytes // 1_000_000} MB")
    return real


def _load(path: Path, calling: tuple[Path, ...], budget: _Budget) -> Flow:
    """Load, check, and inline every sub-flow: the engine only ever sees one flow of plain nodes."""
    flow, doc, shape = _validate(path)
    budget.spend(len(flow.nodes), str(path))
    children: dict[str, Flow] = {}
    for name, node in flow.nodes.items():
        if not isinstance(node, SubflowNode):
            continue
        child_path = path.parent / node.flow  # as the user would write it, in messages
        try:
            confined_file(path.parent, node.flow, MAX_FLOW_FILE_BYTES, "flow file")
        except ValueError as exc:
            raise UserFileError([f"{doc.where(('nodes', name, 'flow'))}: {node.flow}: {exc}"]) from None
        if child_path.resolve() in (path.resolve(), *calling) or len(calling) >= MAX_SUBFLOW_DEPTH:
            chain = " -> ".join(p.name for p in (*calling, path, child_path))
            why = "call each other in a loop" if child_path.resolve() in (path.resolve(), *calling) else \
                f"nest deeper than {MAX_SUBFLOW_DEPTH}"
            raise UserFileError([f"{doc.where(('nodes', name, 'flow'))}: sub-flows {why} ({chain})"])
        if not child_path.is_file():
            raise UserFileError([f"{doc.where(('nodes', name, 'flow'))}: {node.flow}: no such flow file"])
        children[name] = _load(child_path, (*calling, path.resolve()), budget)
    # what a sub-flow sets (its slots, saves) the calling flow may read after it returns
    extra = set().union(*(defined_variables(c) for c in children.values())) if children else set()
    problems = check_flow(flow, subflow=bool(calling), extra_variables=extra, whole=not shape) + \
        _recorded_prompts(flow, path.parent)
    if shape or problems:
        raise UserFileError(shape + [f"{doc.where(loc)}: {msg}" for loc, msg in problems])
    warnings = [f"{doc.where(loc)}: warning: {msg}" for loc, msg in flow_warnings(flow)]
    sources = [path.resolve()]
    for name, child in children.items():
        sources += [s for s in child.sources if s not in sources]
        warnings += child.warnings
        _inline(flow, name, flow.nodes[name], child)
    object.__setattr__(flow, "sources", sources)
    object.__setattr__(flow, "warnings", warnings)
    return flow


_NODE = TypeAdapter(Node)


def _validate(path: Path) -> tuple[Flow, LocatedYaml, list[str]]:
    """The flow, node by node: a node with a wrong shape is reported and left out (its name kept,
    as a plain hangup, so that references to it are not reported again), and everything else is
    still checked, so one run shows every problem."""
    doc = load_yaml(path)
    data = dict(doc.data)
    shape: list[str] = []
    nodes = data.get("nodes")
    if isinstance(nodes, dict):
        good = {}
        for name, raw in nodes.items():
            try:
                good[name] = _NODE.validate_python(raw)
            except ValidationError as exc:
                found = validation_problems(doc, exc, ("nodes", name), model=Flow)
                # the node's own rules run only once its fields are right: say them now as well
                if isinstance(raw, dict) and raw.get("type") == "ask":
                    for rule in ask_rules(raw.get("intents"), raw.get("slots"), raw.get("next")):
                        if not any(rule in f for f in found):
                            found.append(f"{doc.where(('nodes', name))}: nodes.{name}: {rule}")
                shape += found
                good[name] = HangupNode(type="hangup")
        data["nodes"] = good
    try:
        flow = Flow.model_validate(data)
    except ValidationError as exc:
        raise UserFileError(shape + validation_problems(doc, exc, model=Flow)) from None
    return flow, doc, shape


def _inline(flow: Flow, name: str, node: SubflowNode, child: Flow) -> None:
    """The child's nodes join the parent's as "name/node"; the sub-flow node becomes a step into the
    child's start and each `return` a step back to the node's next. Variables, queues and model
    providers the parent lacks are added; the parent's globals, hours and voice apply throughout."""
    prefix = f"{name}{SUBFLOW_SEP}"
    for child_name, child_node in child.nodes.items():
        if isinstance(child_node, ReturnNode):
            new = SayNode(type="say", text=child_node.text, next=node.next) if child_node.text else \
                SetNode(type="set", next=node.next)
        else:
            new = child_node.model_copy(deep=True)
            for sub, target in targets(child_node):
                _retarget(new, sub, prefix + target)
        flow.nodes[prefix + child_name] = new
    flow.nodes[name] = SetNode(type="set", next=prefix + child.start)
    for var, value in child.variables.items():
        flow.variables.setdefault(var, value)
    for qname, uri in child.queues.items():
        flow.queues.setdefault(qname, uri)
    for pname, provider in child.llm.items():
        flow.llm.setdefault(pname, provider)
    flow.env = sorted(set(flow.env) | set(child.env))


def _retarget(node, sub: tuple, target: str) -> None:
    """Point the reference at key path `sub` (as `targets` names it) inside `node` at `target`."""
    obj = node
    for key in sub[:-1]:
        obj = obj[key] if isinstance(obj, (dict, list)) else getattr(obj, key)
    last = sub[-1]
    if isinstance(obj, (dict, list)):
        obj[last] = target
    else:
        setattr(obj, "otherwise" if last == "else" else last, target)


MAX_PROMPT_S = 120  # a recorded prompt longer than this is not a prompt


def _recorded_prompts(flow: Flow, base: Path) -> list[tuple[tuple, str]]:
    """Each node's `audio` file exists and decodes (any WAV encoding, any rate); its path becomes
    absolute, and the audio is loaded once, at 8 kHz, into the prompt store."""
    problems = []
    from callcenter.audio.wavfile import AudioFileError, read_wav

    owners = [(("nodes", name, "audio"), node) for name, node in flow.nodes.items()]
    if flow.voicemail_drop is not None:
        owners.append((("voicemail_drop", "audio"), flow.voicemail_drop))
    for where, node in owners:
        audio = getattr(node, "audio", None)
        if audio is None:
            continue
        try:
            path = confined_file(base, audio, MAX_AUDIO_FILE_BYTES)
        except ValueError as exc:
            problems.append((where, f"recorded prompt: {audio}: {exc}"))
            continue
        try:
            pcm = read_wav(path)
        except AudioFileError as exc:
            problems.append((where, f"recorded prompt: {exc}"))
            continue
        seconds = len(pcm) / 16000
        if seconds > MAX_PROMPT_S or seconds < 0.1:
            problems.append((where, f"recorded prompt {audio!r} lasts {seconds:.1f} s (0.1 to {MAX_PROMPT_S} s)"))
            continue
        node.audio = str(path)
        RECORDED[str(path)] = pcm
    for qname, q in flow.queues.items():
        if not isinstance(q, QueueSettings) or q.music == "generated":
            continue
        path = (base / q.music).resolve()
        try:
            pcm = read_wav(path)
        except AudioFileError as exc:
            problems.append((("queues", qname, "music"), f"hold music: {exc}"))
            continue
        if len(pcm) < 16000:
            problems.append((("queues", qname, "music"), f"hold music {q.music!r} is shorter than a second"))
            continue
        q.music = str(path)
        RECORDED[str(path)] = pcm
    return problems


RECORDED: dict[str, bytes] = {}  # recorded prompts, 8 kHz 16-bit PCM, by absolute path (loaded with the flow)


def flow_warnings(flow: Flow) -> list[tuple[tuple, str]]:
    """What is allowed but probably not meant."""
    out = []
    globals_by_key = {g.keypad: name for name, g in flow.globals.intents.items() if g.keypad}
    for name, node in flow.nodes.items():
        if not isinstance(node, AskNode):
            continue
        digit_asks = [("slots", s) for s, slot in node.slots.items() if slot.type == "digits"] + \
                     [("intents", i) for i, intent in node.intents.items() if intent.digits is not None]
        for key, gname in sorted(globals_by_key.items()):
            if not key.isdigit():
                continue
            for where in digit_asks:
                if node.keypad_globals:
                    out.append((("nodes", name) + where,
                                f"keypad {key} is the global intent {gname!r}: pressed first here it goes there, "
                                f"not into the number (keypad_globals: false to make it a digit)"))
                else:
                    out.append((("nodes", name) + where,
                                f"keypad {key} (the global intent {gname!r}) is only a digit here "
                                f"(keypad_globals: false): callers cannot reach {gname!r} by key"))
    return out


# the schema's descriptions of fields declared without one: "Class.field" first, then "field"
FIELD_DOCS = {
    "next": "The node to go to next (a key under nodes).",
    "examples": "Phrases a caller might say for this; matched by meaning, not word for word.",
    "keypad": "The keypad digit that chooses this (0-9, * or #).",
    "intents": "What the caller may want here: name -> examples, keypad and next node.",
    "options": "The menu's choices, read out in order: 'For {label}, press {key}.'",
    "min_length": "Fewest digits accepted.",
    "max_length": "Most digits accepted.",
    "prompt": "What the agent says first (a template).",
    "text": "What the agent says (a template).",
    "Flow.name": "The flow's name: shown in the console, events and recordings.",
    "Flow.version": "Your version label, kept in every call's events.",
    "Flow.voice": "The agent's voice for this flow (a name like ssm:heart, or name, speed and pitch).",
    "Flow.ambience": "The phone line's character: a preset (clean, office, callcenter, mobile) or settings.",
    "Flow.globals": "Intents available at every question (operator, goodbye) and the call-wide retry limits.",
    "Flow.trouble": "What the caller hears when a part of the agent fails, and where they are sent.",
    "Flow.start": "The first node of every call.",
    "Flow.nodes": "The flow's steps: name -> node (say, ask, menu, branch, set, webhook, llm, transfer, "
                  "voicemail, hangup).",
    "Globals.on_no_match": "Node after max_no_match answers in the call that matched nothing.",
    "Globals.on_no_input": "Node after max_no_input silences in the call.",
    "HangupNode.text": "Said before hanging up (a template).",
    "Trouble.say": "Said at once when a part of the agent fails.",
    "Trouble.call_back": "Said when nobody can take the call: ask the caller to call back.",
    "Trouble.transferring": "Said before transferring to transfer_to.",
    "VoicemailNode.beep": "Play a beep before recording.",
    "WebhookNode.method": "GET, or POST with body as JSON.",
    "WebhookNode.timeout_s": "Seconds to wait for the reply before taking on_failure.",
    "LlmProviderConfig.model": "The provider's model name.",
    "LlmProviderConfig.max_tokens": "Most tokens of one reply.",
    "LlmTool.description": "What the tool does, for the model.",
    "AmbienceSettings.preset": "Starting point: clean, office, callcenter or mobile; the fields below override it.",
    "AmbienceSettings.enabled": "false: no ambience at all.",
    "AmbienceSettings.hum_hz": "Mains frequency of the hum: 50 or 60.",
    "AmbienceSettings.bed": "Background bed: none, office or callcenter.",
}


def flow_schema() -> dict:
    """JSON Schema of flow files, for editors (yaml-language-server) to complete and validate."""
    schema = Flow.model_json_schema(by_alias=True)
    shorthand = {"#/$defs/VoiceSettings": "a voice name, e.g. ssm:reed",
                 "#/$defs/AmbienceSettings": "a preset: clean, office, callcenter or mobile",
                 "#/$defs/VoicemailDrop": "the message's text"}

    def allow_names(node):  # voice: ssm:joe and ambience: office are accepted as plain strings
        if isinstance(node, dict):
            for key, value in list(node.items()):
                if isinstance(value, dict) and value.get("$ref") in shorthand:
                    node[key] = {"anyOf": [{"type": "string", "description": shorthand[value["$ref"]]}, value]}
                elif isinstance(value, dict) and any(x.get("$ref") in shorthand for x in value.get("anyOf", [])):
                    value["anyOf"].insert(0, {"type": "string"})
                else:
                    allow_names(value)
        elif isinstance(node, list):
            for item in node:
                allow_names(item)

    allow_names(schema)
    for name, definition in [("Flow", schema), *schema["$defs"].items()]:
        for field, spec in definition.get("properties", {}).items():
            text = FIELD_DOCS.get(f"{name}.{field}") or FIELD_DOCS.get(field)
            if "description" not in spec and text:
                spec["description"] = text
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "callcenter flow"
    return schema
