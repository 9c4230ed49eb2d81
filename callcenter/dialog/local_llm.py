"""The offline generative provider (`kind: local-llm`) and the hybrid that puts it behind the
embedding path (what `kind: local` becomes once the model is built).

- `LocalLlm`: Qwen2.5-Coder-1.5B-Instruct, CTranslate2 int8 (`llm_model.py` builds it). The node's
  instructions, knowledge, choices, slots and tools make the system prompt, which CTranslate2 keeps
  as a cached prefix (`static_prompt`): a turn feeds only the conversation and the caller's words.
  The model answers in a small line format (`choice:`, one line per slot, `tool:`, then `say:`), so
  its decision is held to the node's lists here (anything else is dropped and logged; the engine
  checks again), and the words after `say:` stream to the voice sentence by sentence.
- `Admission`: a 1.5B model uses both cores while it thinks, so the machine runs at most N model
  turns at once (`CALLCENTER_LLM_SLOTS`, default 1) across every worker process, by lock files. A
  turn that cannot start within `ADMISSION_WAIT_S` is refused (`LlmBusy`).
- `EndOfTurn`: the same model judges whether the caller's words so far read as a finished sentence,
  so that the turn detector can end a free-speech turn after a short pause (a semantic end of turn).
- `HybridTriage`: the embedding path (`LocalTriage`) decides clear cases at once; an unclear one goes
  to the model; a refused or failed model turn falls back to the embedding path's own reply, so the
  caller never waits in silence. It counts each path for `bench nlu` and `/metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import math
import os
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from callcenter.dialog.engine import LlmReply, LlmRequest
from callcenter.dialog.llm import DONT_KNOW, LlmError, LocalTriage, TextSink, rule_slots, split_sentences
from callcenter.dialog.llm_model import LlmModelError, installed, model_dir
from callcenter.dialog.slots import numbers_in

log = structlog.get_logger()

ADMISSION_WAIT_S = 0.4  # a model turn that cannot start by then goes the embedding way
MAX_NEW_TOKENS = 96
EXAMPLES = 5  # example phrases per choice shown to the model
CHOICE_PREFIX = "choice:"
MIN_CHOICE_P = 0.6  # a choice the model is less sure of than this is not taken (the embedding path asks)
# the embedding path disputes a model's choice when its own nearest intent is at least this close and
# this far ahead of the model's: two judges that disagree, so the caller is asked instead
DISPUTE_SIM, DISPUTE_LEAD = 0.45, 0.05
MODEL_SHARE_OF_BUDGET = 0.7  # of an llm node's time_budget_s, in the hybrid; then the embedding path answers
# a model turn says the node's acknowledgement this soon unless it has spoken: its own first words
# take 1.5-3 s on 2 cores (bench call's model_turns), so at once
ACKNOWLEDGE_AFTER_S = 0.0
SLOT_FORMS = {"date": "as YYYY-MM-DD", "time": "as HH:MM, 24-hour", "number": "in digits",
              "digits": "digits only", "currency": "as an amount in digits, like 25.50", "yes_no": "yes or no",
              "text": "in the caller's words"}
THREADS = 2
# semantic end of turn: the caller's words, as a chat message, read as finished when the model gives
# the next token being a sentence end or the message's end at least this log-probability. Whisper
# writes a full stop after audio cut off mid-sentence too, so the words are judged without their
# punctuation. Chosen on callers' sentences cut at a pause (`bench nlu`'s end_of_turn row): finished
# ones ~73 % at or above it, cut ones ~7 %
FINISHED_LOGP = -2.5
END_TOKENS = (".", "?", "!", ".\u010a", "?\u010a", "!\u010a", ".\u010a\u010a", "?\u010a\u010a", "<|im_end|>", "<|endoftext|>")
END_OF_TURN_WORDS = 48  # only the last this many words are judged (a bounded cost)
SLOTS_ENV = "CALLCENTER_LLM_SLOTS"
OFF_ENV = "CALLCENTER_LLM"  # "off": `local` stays the embedding path even with the model built
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
NONE_WORDS = {"none", "null", "n/a", "unknown", "", "-"}


PATHS: Counter[str] = Counter()  # this process's hybrid turns by path, for /metrics


class LlmBusy(LlmError):
    """Every model slot of the machine is busy: this turn goes the embedding way."""


class LlmUnsure(LlmError):
    """The model started on a choice it was not sure of: nothing was said; the embedding way asks."""


class LlmWithheld(LlmError):
    """Everything the model wrote for the caller was withheld (`Grounding`) and it chose nothing: the
    embedding way answers (a quoted fact, a clarifying question, or that it does not know)."""


class Admission:
    """At most `slots` model turns at once on this machine, across processes (flock on files)."""

    def __init__(self, slots: int | None = None, folder: Path | None = None):
        self.slots = slots or int(os.environ.get(SLOTS_ENV, "1") or 1)
        self.folder = folder or model_dir().parent / "slots"
        self.folder.mkdir(parents=True, exist_ok=True)

    def try_acquire(self) -> int | None:
        for i in range(self.slots):
            fd = os.open(self.folder / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                os.close(fd)
        return None

    async def acquire(self, wait_s: float = ADMISSION_WAIT_S) -> int:
        deadline = time.monotonic() + wait_s
        while True:
            fd = self.try_acquire()
            if fd is not None:
                return fd
            if time.monotonic() >= deadline:
                raise LlmBusy(f"all {self.slots} model slot(s) busy for {wait_s} s")
            await asyncio.sleep(0.01)

    @staticmethod
    def release(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class LocalModel:
    """The loaded generator and tokenizer (one per process; loading takes a second or two)."""

    _shared: "LocalModel | None" = None
    _lock = threading.Lock()

    def __init__(self, path: Path | None = None, threads: int = THREADS):
        import ctranslate2
        from tokenizers import Tokenizer

        path = Path(path or model_dir())
        if not (path / "model.bin").exists():
            raise LlmModelError(f"no model at {path}: run `callcenter llm build` (needs pip install -e '.[llm]')")
        self.generator = ctranslate2.Generator(str(path), device="cpu", compute_type="int8",
                                               inter_threads=1, intra_threads=threads)
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))

    @classmethod
    def shared(cls) -> "LocalModel":
        with cls._lock:
            if cls._shared is None:
                cls._shared = LocalModel()
            return cls._shared

    def tokens(self, text: str) -> list[str]:
        return self.tokenizer.encode(text, add_special_tokens=False).tokens

    @functools.cached_property
    def _end_ids(self) -> list[int]:
        vocab = self.tokenizer.get_vocab()
        return [vocab[t] for t in END_TOKENS if t in vocab]

    def end_logprob(self, words: str) -> float:
        """log P(the caller's message ends after `words`): the next token a sentence end or the end
        of the message. One forward pass over a few dozen tokens (about 0.1 s on 2 cores)."""
        ids = self.tokenizer.encode(f"{IM_START}user\n{words}", add_special_tokens=False).ids
        logits = np.asarray(self.generator.forward_batch([ids]))[0, -1].astype(np.float64)
        logits -= logits.max()
        p = np.exp(logits)
        return float(math.log(p[self._end_ids].sum() / p.sum()))

    def generate(self, static: str, prompt: str, on_text, stop: threading.Event,
                 max_new_tokens: int = MAX_NEW_TOKENS, on_first=None) -> float:
        """Greedy decoding of `prompt` after the cached `static` prefix; `on_text(delta)` for each
        new piece of text (on this thread). Returns the probability of the first token (how sure
        the model was of what it started with: with the prompt ending in `choice:`, of its choice)."""
        ids: list[int] = []
        text = ""
        first_p = 1.0
        for step in self.generator.generate_tokens(self.tokens(prompt), static_prompt=self.tokens(static),
                                                   max_length=max_new_tokens, sampling_topk=1, return_log_prob=True,
                                                   end_token=[IM_END, "<|endoftext|>"]):
            if not ids:
                first_p = math.exp(step.log_prob)
                if on_first is not None:
                    on_first(first_p)
            if stop.is_set():
                break
            ids.append(step.token_id)
            new = self.tokenizer.decode(ids)
            if new.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
                continue
            delta, text = new[len(text):], new
            if delta:
                on_text(delta)
        return first_p


def system_prompt(request: LlmRequest) -> str:
    """The node's part of the prompt, the same for every turn at this node on one day (the cached
    prefix)."""
    parts = [request.instructions.strip(), "You are a phone agent. Keep every reply to one or two short spoken "
                                           "sentences: no lists, no markdown, no emoji."]
    if request.today:
        parts.append(f"Today is {request.today}.")
    if request.knowledge:
        parts.append("Facts. Answer only from them, in their words. If they do not answer the caller's question, "
                     f"say: I don't have that information.\n{request.knowledge.strip()}")
    lines = ["Write your reply in exactly this format, one item per line:"]
    if request.choices:
        listing = "\n".join(f"- {n}: {desc}" + (f" (for example: {'; '.join(examples[:EXAMPLES])})"
                                                if examples else "")
                            for n, (desc, examples) in request.choices.items())
        parts.append("What the caller may need. Choose one only when the caller's words clearly ask for it; "
                     "a problem with the caller's own device, connection or account is not an outage "
                     f"unless they say an area or many people are affected:\n{listing}")
        lines.append(f"choice: one of {', '.join(request.choices)}, or none (greetings, yes or no alone, "
                     "anything else)")
    for name, slot in request.slots.items():
        lines.append(f"{name}: the {slot.type} the caller gave {SLOT_FORMS.get(slot.type, '')}, or none")
    if request.tools:
        tools = "; ".join(f"{n} ({t.description or t.type})" for n, t in request.tools.items())
        lines.append(f"tool: one of {', '.join(request.tools)} ({tools}), or none")
    lines.append(f"say: {SAY_HINT_CHOICES if request.choices else SAY_HINT}")
    parts.append("\n".join(lines))
    return f"{IM_START}system\n" + "\n\n".join(parts) + f"{IM_END}\n"


def turn_prompt(request: LlmRequest) -> str:
    """The conversation so far and the caller's words: what each turn feeds after the prefix."""
    out = []
    for who, text in request.history[-6:]:
        role = "user" if who == "caller" else "assistant"
        out.append(f"{IM_START}{role}\n{text}{IM_END}\n")
    out.append(f"{IM_START}user\n{request.utterance}{IM_END}\n{IM_START}assistant\n")
    if request.choices:  # the reply starts with the choice: its first token's probability is the confidence
        out.append(CHOICE_PREFIX)
    return "".join(out)


SAY_HINT = "your answer, or one short question back"
SAY_HINT_CHOICES = ("what you say to the caller (when you chose, a short confirmation; when unsure, one short "
                    "clarifying question)")
NOT_KNOWN = re.compile(r"\b(don't|do not|doesn't|does not) have (that|this|any|the) information|\bi (don't|do not) know\b|"
                       r"\bnot sure\b", re.I)  # the model declining: always fine to say
SUPPORT_MIN = 0.6  # a statement at a node with facts must be this close (cosine) to one of the facts
NEW_WORDS_MAX = 1  # ...and bring at most this many words that are in neither the facts nor the conversation
ECHO_MIN = 0.9  # a question back this close to the caller's own words is an echo, not a question
_STOP = frozenset("""a an the and or but if then so to of in on at by for from with about as into over after before
is are was were be been being am do does did done have has had having will would shall should can could may might
must i you he she it we they me him her us them my your his its our their this that these those there here what
which who whom whose when where why how not no yes yeah ok okay please sorry thanks thank all any some just also
very too more most much many one get got let well up out again now today""".split())


def _words(text: str) -> set[str]:
    return {w.removesuffix("'s").rstrip("s") for w in re.findall(r"[a-z][a-z']+", text.lower()) if w not in _STOP}


HEDGE_WORDS = frozenset({"sorry", "afraid", "information", "know", "sure", "have", "that", "m", "i'm"})


def only_a_hedge(sentence: str) -> bool:
    """"I'm sorry, I don't have that information." — a decline and nothing more. A hedge followed
    by anything else ("I do not know, please email your card number to …") is not."""
    return bool(NOT_KNOWN.search(sentence)) and not numbers_in(sentence) and \
        not (_words(NOT_KNOWN.sub(" ", sentence)) - HEDGE_WORDS)


class Grounding:
    """What the model may say, sentence by sentence: every number (a time, a price, a count, spoken or
    in digits; not 0 or 1, "one moment") must be in the node's facts, never merely in what the caller
    said (a caller's "500" does not make "500 business days" true); at a node with facts a statement
    must also be close to one of them (the sentence encoder's cosine) and add at most NEW_WORDS_MAX
    words that are not in them; a question back is fine unless it only echoes the caller. A decline
    ("I don't have that information") passes only when it is nothing but a decline."""

    def __init__(self, request: LlmRequest, encoder=None):
        self.request = request
        self.numbers = {v for v, _, _ in numbers_in(request.knowledge or "")}
        self.known = _words(request.knowledge or "")
        self._encoder = encoder

    def encoder(self):
        if self._encoder is None:
            from callcenter.dialog.embed import shared_encoder

            self._encoder = shared_encoder()
        return self._encoder

    def why_not(self, sentence: str) -> str | None:
        """None if the sentence may be said, else why not."""
        if only_a_hedge(sentence):
            return None
        if any(v not in self.numbers and v not in (0, 1) for v, _, _ in numbers_in(sentence)):
            return "a number not in the facts"
        vec = self.encoder().vector(sentence) if self.request.knowledge or sentence.endswith("?") else None
        if sentence.endswith("?"):
            if float(self.encoder().vector(self.request.utterance) @ vec) >= ECHO_MIN:
                return "an echo of the caller's words"
            return None
        if not self.request.knowledge:
            return None
        facts = np.stack([self.encoder().vector(f) for f in split_sentences(self.request.knowledge)])
        if float((facts @ vec).max()) < SUPPORT_MIN:
            return "not close to any fact"
        new = _words(sentence) - self.known
        if len(new) > NEW_WORDS_MAX:
            return f"words not in the facts: {', '.join(sorted(new)[:5])}"
        return None


_SENTENCE_END = re.compile(r"[.!?](\s+)")


class ReplyParser:
    """Reads the model's lines as they stream. Header lines (choice, slots, tool) are collected.
    The text after `say:` goes to the voice a sentence at a time, but only what may be said:
    - nothing once the model has made a sure choice (the choice's next node speaks: a routing turn
      ends at `say:`, `done`) or an unsure one (`unsure`: the embedding path asks instead);
    - only what `Grounding` allows: no number the model made up, and at a node with facts, no
      statement that is not close to one of them.
    A withheld statement is logged; if nothing was said at a node with facts, the caller hears
    that the agent does not have that information."""

    def __init__(self, request: LlmRequest, on_text: TextSink, grounding: Grounding | None = None,
                 disputed: frozenset[str] = frozenset()):
        self.request = request
        self.disputed = frozenset(d.lower() for d in disputed)  # choices another judge argues against: unsure
        self.on_text = on_text
        self.grounding = grounding or Grounding(request)
        self.buffer = CHOICE_PREFIX if request.choices else ""  # the prompt ends with it
        self.saying = False
        self.pending = ""  # said text not yet a whole sentence
        self.fields: dict[str, str] = {}
        self.said = ""
        self.withheld: list[str] = []
        self.choice_p = 1.0  # the model's probability for the first token of its choice
        self.unsure = False  # it chose, but not surely: say nothing of what it goes on to write
        self.chose = False  # a sure choice of the node's: nothing to say, the flow moves on
        self.done = False  # nothing more of the model's output is wanted: stop decoding

    def confidence(self, p: float) -> None:
        self.choice_p = p

    def feed(self, delta: str) -> None:
        if self.done:
            return
        if self.saying:
            self._say(delta)
            return
        self.buffer += delta
        while "\n" in self.buffer or re.match(r"\s*say\s*:", self.buffer, re.I):
            m = re.match(r"\s*say\s*:\s*", self.buffer, re.I)
            if m:
                if self.chose or self.unsure:
                    self.done = True
                    return
                self.saying = True
                rest, self.buffer = self.buffer[m.end():], ""
                self._say(rest)
                return
            line, self.buffer = self.buffer.split("\n", 1)
            key, sep, value = line.partition(":")
            if sep:
                key, value = key.strip().lower(), value.strip()
                self.fields[key] = value
                if key == "choice":
                    choice = value.strip(".").lower()
                    if choice not in NONE_WORDS and (self.choice_p < MIN_CHOICE_P
                                                     or choice in self.disputed):
                        self.unsure = True
                    elif choice in {n.lower() for n in self.request.choices}:
                        self.chose = True
                        if not self.request.slots and not self.request.tools:
                            self.done = True  # a routing turn: nothing more is needed
                            return

    def _say(self, delta: str) -> None:
        delta = delta.replace('"', "")  # the model likes to quote what it says: nothing to speak
        if "\n" in delta:  # the say line is the last: whatever follows is not for the caller
            delta = delta.split("\n", 1)[0]
            self.done = True
        self.pending += delta
        while (m := _SENTENCE_END.search(self.pending)) is not None:
            sentence, self.pending = self.pending[:m.start() + 1], self.pending[m.end():]
            self._sentence(sentence)
        if self.done:
            self._sentence(self.pending)
            self.pending = ""

    def _sentence(self, sentence: str) -> None:
        sentence = sentence.strip()
        if sentence.lower().startswith((SAY_HINT.split(",")[0], SAY_HINT_CHOICES.split(" (")[0])):  # echoed format
            sentence = sentence.split(":", 1)[-1].strip()
        if not sentence or self.unsure or self.chose:
            return
        why = self.grounding.why_not(sentence)
        if why is None:
            self.said += sentence + " "
            self.on_text(sentence + " ")
            return
        self.withheld.append(sentence)
        log.info("llm_sentence_withheld", node=self.request.node, why=why, sentence=sentence[:120])

    def close(self, choice_p: float = 1.0) -> LlmReply:
        """The decision; a choice the model was less sure of than MIN_CHOICE_P is dropped."""
        if not self.saying and not self.done and self.buffer.strip():  # the last header line, or no format
            key, sep, value = self.buffer.partition(":")
            if sep and key.strip().lower() in ("choice", "tool", *self.request.slots):
                self.fields[key.strip().lower()] = value.strip()
            elif not self.fields:  # a model that skipped the format: its words are the reply
                self._say(self.buffer.strip())
        if self.pending.strip():
            self._sentence(self.pending)
            self.pending = ""
        out = LlmReply(text=self.said.strip())
        choice = self.fields.get("choice", "").strip().strip(".").lower()
        if choice not in NONE_WORDS and (choice_p < MIN_CHOICE_P or self.unsure):
            log.info("llm_choice_unsure", node=self.request.node, choice=choice[:60], p=round(choice_p, 2),
                     disputed=choice in self.disputed)
        elif choice not in NONE_WORDS:
            names = {n.lower(): n for n in self.request.choices}
            if choice in names:
                out.choice = names[choice]
            else:
                log.warning("llm_choice_rejected", node=self.request.node, choice=choice[:60])
        for name in self.request.slots:
            value = self.fields.get(name.lower(), "").strip().strip(".")
            if value.lower() not in NONE_WORDS:
                out.slots[name] = value
        tool = self.fields.get("tool", "").strip().strip(".")
        if tool.lower() not in NONE_WORDS:
            if tool in self.request.tools:
                out.tool = tool
            else:
                log.warning("llm_tool_rejected", node=self.request.node, tool=tool[:60])
        return out


def acknowledge_later(request: LlmRequest, on_text: TextSink, said) -> asyncio.TimerHandle | None:
    """The node's acknowledgement, ACKNOWLEDGE_AFTER_S into a model turn, unless `said()` by then."""
    if not request.acknowledgement:
        return None

    def ack() -> None:
        if not said():
            on_text(request.acknowledgement.strip() + " ")
    return asyncio.get_running_loop().call_later(ACKNOWLEDGE_AFTER_S, ack)


class _OnTheModel:
    """Uses the process's model (loaded at first use) under the machine's admission slots."""

    def __init__(self, model: LocalModel | None = None, admission: Admission | None = None):
        self._model = model
        self.admission = admission or Admission()

    @property
    def model(self) -> LocalModel:
        if self._model is None:
            self._model = LocalModel.shared()
        return self._model


class EndOfTurn(_OnTheModel):
    """Does what the caller said so far read as a finished sentence? (The turn detector then ends the
    turn after a short pause rather than the node's whole `end_silence_ms`; LiveKit Agents' turn
    detector does the same with a small fine-tuned model.) Called on a worker thread. It takes a
    model slot only if one is free at once: while another turn holds the model, it answers False
    (not judged: the node's silence ends the turn), never waiting behind a model turn."""

    @staticmethod
    def words(text: str) -> str:
        return " ".join(re.findall(r"[a-z0-9']+", text.lower())[-END_OF_TURN_WORDS:])

    def logprob(self, text: str) -> float | None:
        """log P(finished), or None when the model is busy or there are no words."""
        words = self.words(text)
        if not words:
            return None
        fd = self.admission.try_acquire()
        if fd is None:
            return None
        try:
            return self.model.end_logprob(words)
        finally:
            Admission.release(fd)

    def __call__(self, text: str) -> bool:
        try:
            lp = self.logprob(text)
        except (LlmModelError, RuntimeError, OSError) as exc:
            log.warning("end_of_turn_failed", error=str(exc))
            return False
        return lp is not None and lp >= FINISHED_LOGP


class LocalLlm(_OnTheModel):
    """`kind: local-llm`: every turn goes to the model (waiting for a slot at most ADMISSION_WAIT_S)."""

    @functools.cached_property
    def end_of_turn(self) -> EndOfTurn:
        return EndOfTurn(self._model, self.admission)

    async def reply(self, request: LlmRequest, on_text: TextSink, acknowledge: bool = True,
                    disputed: frozenset[str] = frozenset(), hybrid: bool = False) -> LlmReply:
        """One model turn. With `acknowledge`, the node's acknowledgement is said if the model has
        said nothing ACKNOWLEDGE_AFTER_S in. In the `hybrid` (which says the acknowledgement itself,
        so that it is not taken for the model's words) a `disputed` choice is taken as unsure
        (LlmUnsure), and a reply whose every sentence was withheld raises LlmWithheld; alone, the
        model then says that it does not have that information."""
        parser = ReplyParser(request, on_text, disputed=disputed)
        ack = acknowledge_later(request, on_text, lambda: bool(parser.said)) if acknowledge else None
        try:
            return await self._reply(request, on_text, parser, hybrid)
        finally:
            if ack is not None:
                ack.cancel()

    async def _reply(self, request: LlmRequest, on_text: TextSink, parser: ReplyParser, hybrid: bool) -> LlmReply:
        fd = await self.admission.acquire()
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def delta(text: str) -> None:
            if parser.unsure or parser.done:
                stop.set()
            loop.call_soon_threadsafe(parser.feed, text)

        def first(p: float) -> None:
            loop.call_soon_threadsafe(parser.confidence, p)

        try:
            choice_p = await loop.run_in_executor(None, functools.partial(
                self.model.generate, system_prompt(request), turn_prompt(request), delta, stop, on_first=first))
        except asyncio.CancelledError:
            stop.set()  # the time budget ran out or the caller hung up: the model stops at its next token
            raise
        finally:
            Admission.release(fd)
        await asyncio.sleep(0)  # the last deltas, posted from the model's thread, are fed first
        if parser.unsure:
            raise LlmUnsure(f"choice {parser.fields.get('choice', '')!r} at p={choice_p:.2f}")
        reply = parser.close(choice_p)
        reply.slots = {**reply.slots, **rule_slots(request)}
        if hybrid and parser.withheld and not reply.text and reply.choice is None and reply.tool is None:
            raise LlmWithheld(f"{len(parser.withheld)} sentence(s) withheld")
        if not reply.text and reply.choice is None and reply.tool is None and (request.knowledge or parser.withheld):
            reply.text = DONT_KNOW
            on_text(DONT_KNOW)
        return reply


class HybridTriage:
    """The embedding path first; the model only for what it cannot decide. `counts` says which path
    each turn took: `embedding` (clear at once), `model`, `unsure` (the model's choice was not sure:
    the embedding path's reply, a clarifying question), `busy` (no model slot in time: the same),
    `slow` (neither a decision nor a word within 70 % of the node's time budget: the same),
    `withheld` (every sentence it wrote failed `Grounding`: the same),
    `failed` (the model raised)."""

    def __init__(self, local: LocalTriage | None = None, model: LocalLlm | None = None):
        self.local = local or LocalTriage()
        self.model = model or LocalLlm()
        self.counts: Counter[str] = Counter()
        self.seconds: dict[str, list[float]] = {}

    @property
    def end_of_turn(self) -> EndOfTurn:
        return self.model.end_of_turn

    @staticmethod
    def disputed(ranked: list[tuple[str, float]], request: LlmRequest | None = None) -> frozenset[str]:
        """The choices the model may not take surely:
        - every one, when the caller's words hold nothing but function words ("yes", "okay") and
          the agent has asked nothing at this node yet (a bare "yes" cannot pick a route);
        - those the embedding path argues against: when its nearest intent is close (DISPUTE_SIM),
          every intent it puts DISPUTE_LEAD or more behind that one."""
        if request is not None and not _words(request.utterance) and not any(w == "agent" for w, _ in request.history):
            return frozenset(request.choices)
        if not ranked or ranked[0][1] < DISPUTE_SIM:
            return frozenset()
        top = ranked[0][1]
        return frozenset(n for n, sim in ranked[1:] if top - sim >= DISPUTE_LEAD)

    def _took(self, path: str, t0: float, reply: LlmReply) -> LlmReply:
        self.counts[path] += 1
        PATHS[path] += 1
        self.seconds.setdefault(path, []).append(time.monotonic() - t0)
        reply.via = path
        return reply

    async def reply(self, request: LlmRequest, on_text: TextSink) -> LlmReply:
        t0 = time.monotonic()
        disputed: frozenset[str] = frozenset()
        if request.choices:
            matcher = self.local._matcher(request)
            m = matcher.match(request.utterance)
            if m.intent is not None:  # clear: today's 10 ms path decides
                return self._took("embedding", t0, await self.local.reply(request, on_text))
            disputed = self.disputed(matcher.ranked(request.utterance), request)
        speaking = asyncio.Event()

        def speak(delta: str) -> None:
            speaking.set()
            on_text(delta)
        turn = asyncio.ensure_future(self.model.reply(request, speak, acknowledge=False, disputed=disputed,
                                                      hybrid=True))
        ack = acknowledge_later(request, on_text, speaking.is_set)
        try:
            # the model must decide or start speaking within part of the node's budget (the rest is
            # for the embedding path's answer); once it speaks, it may finish its sentence
            first = asyncio.ensure_future(speaking.wait())
            await asyncio.wait({turn, first}, timeout=request.time_budget_s * MODEL_SHARE_OF_BUDGET,
                               return_when=asyncio.FIRST_COMPLETED)
            first.cancel()
            if not turn.done() and not speaking.is_set():
                turn.cancel()
                log.warning("llm_model_slow", node=request.node, budget_s=request.time_budget_s)
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await turn
                raise TimeoutError
            return self._took("model", t0, await turn)
        except TimeoutError:
            path = "slow"
        except asyncio.CancelledError:
            turn.cancel()
            raise
        except LlmBusy as exc:
            log.warning("llm_admission_refused", node=request.node, error=str(exc))
            path = "busy"
        except LlmUnsure as exc:
            log.info("llm_unsure", node=request.node, detail=str(exc))
            path = "unsure"
        except LlmWithheld as exc:
            log.info("llm_withheld", node=request.node, detail=str(exc))
            path = "withheld"
        except (LlmError, LlmModelError, RuntimeError, OSError) as exc:
            log.error("llm_model_failed", node=request.node, error=str(exc))
            path = "failed"
        finally:
            if ack is not None:
                ack.cancel()
        return self._took(path, t0, await self.local.reply(request, on_text))


def hybrid_on() -> bool:
    """Does `kind: local` put the model behind the embedding path: built, and not CALLCENTER_LLM=off?"""
    return installed() and os.environ.get(OFF_ENV, "").lower() != "off"


def uses_model(flow) -> bool:
    """Will this flow's llm nodes reach the offline model (local-llm, or local with the hybrid on)?"""
    from callcenter.dialog.flow import LlmNode

    kinds = {flow.llm[n.provider].kind for n in flow.nodes.values() if isinstance(n, LlmNode) and n.provider in flow.llm}
    return "local-llm" in kinds or ("local" in kinds and hybrid_on())


def warm_model(flow) -> bool:
    """Load the model now (a few seconds, about 1.8 GB) if the flow will use it, so that the first
    caller does not wait for it. True if loaded."""
    if not uses_model(flow):
        return False
    t0 = time.monotonic()
    LocalModel.shared()
    log.info("llm_model_loaded", path=str(model_dir()), seconds=round(time.monotonic() - t0, 1))
    return True


def default_local_provider() -> Any:
    """What `kind: local` runs: the hybrid when the model is built (unless CALLCENTER_LLM=off), else
    the embedding path alone."""
    if hybrid_on():
        return HybridTriage()
    return LocalTriage()
