"""The offline generative model for llm nodes: its reply format read as it streams, admission
control across processes, the hybrid's fallback to the embedding path, the packaged model's
checksum, and (where `callcenter llm build` has run) real turns through the model."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from callcenter.dialog.engine import LlmRequest
from callcenter.dialog.flow import LlmTool, Slot
from callcenter.dialog.llm_model import LlmModelError, installed
from callcenter.dialog.local_llm import (
    ACKNOWLEDGE_AFTER_S,
    FINISHED_LOGP,
    MIN_CHOICE_P,
    Admission,
    EndOfTurn,
    Grounding,
    HybridTriage,
    LlmBusy,
    LocalLlm,
    ReplyParser,
    rule_slots,
    system_prompt,
    turn_prompt,
)

CHOICES = {"billing": ("Billing, charges, payments or refunds", ("my bill", "I was charged twice")),
           "technical": ("Technical support with a device or connection", ("my router does not work",)),
           "outage": ("An outage or no service in an area", ("is the network down",))}


def request(utterance: str, **over) -> LlmRequest:
    base = dict(node="triage", provider="local", instructions="You route callers of Example Telecom.",
                knowledge=None, choices=CHOICES, slots={}, tools={}, history=(), utterance=utterance,
                time_budget_s=8, fallback="Sorry.")
    base.update(over)
    return LlmRequest(**base)


def test_a_sure_choice_routes_without_words_and_its_slots_are_read():
    req = request("I was billed twice, account 4471", slots={"account": Slot(type="digits")},
                  tools={"to_person": LlmTool(type="transfer", to="sip:desk@127.0.0.1")})
    spoken = []
    parser = ReplyParser(req, spoken.append)
    for piece in (" bill", "ing\nacc", "ount: 4471\ntool: none\nsa", "y: \"Sure", ", let me check", " that.\""):
        parser.feed(piece)
    reply = parser.close()
    assert reply.choice == "billing" and reply.slots == {"account": "4471"} and reply.tool is None
    assert parser.done and spoken == [] and reply.text == ""  # the choice's next node speaks
    routing = ReplyParser(request("I was billed twice"), spoken.append)
    routing.feed(" billing\n")
    assert routing.done  # no slots or tools to read: decoding stops at the choice
    # a choice or tool that is not the node's is dropped; an unsure or disputed choice says nothing
    odd = ReplyParser(req, lambda _: None)
    for piece in (" refunds\ntool: format_disk\nsay: Okay."):
        odd.feed(piece)
    out = odd.close()
    assert out.choice is None and out.tool is None
    unsure = ReplyParser(req, spoken.append)
    unsure.confidence(MIN_CHOICE_P / 2)
    for piece in (" outage\n", "say: Let me put you through to our outage team."):
        unsure.feed(piece)
    disputed = ReplyParser(req, spoken.append, disputed=frozenset({"outage"}))
    for piece in (" outage\n", "say: Let me put you through to our outage team."):
        disputed.feed(piece)
    assert unsure.unsure and disputed.unsure and spoken == [] and disputed.close().choice is None


def test_words_stream_a_sentence_at_a_time_and_only_what_is_grounded():
    spoken = []
    parser = ReplyParser(request("hmm my thing is odd"), spoken.append)
    for piece in (" none\nsay: what you say to the caller: I see", ". Is it the router", " or the phone?\nchoice: x"):
        parser.feed(piece)
        if piece.endswith("I see"):
            assert spoken == []  # half a sentence waits
    reply = parser.close()
    assert spoken == ["I see. ", "Is it the router or the phone? "] and reply.text == "I see. Is it the router or the phone?"
    facts = "Our shops are open from 9 am to 6 pm, Monday to Saturday. Engineers expect service back by 6 pm today."
    ground = Grounding(request("when do the shops open", choices={}, knowledge=facts))
    assert ground.why_not("The shops open at 9 am, Monday to Saturday.") is None
    assert "number" in ground.why_not("The shops open at 8 am.")
    assert "number" in ground.why_not("The fibre plan costs $15 a month.")
    assert ground.why_not("Yes, you can buy a new phone in our shops.") is not None  # not in the facts
    assert ground.why_not("I'm sorry, I don't have that information.") is None
    assert ground.why_not("When do the shops open?") is not None  # the caller's own question echoed
    assert ground.why_not("Which shop do you mean?") is None
    free = Grounding(request("my router is broken"))  # no facts: only numbers are held to the conversation
    assert free.why_not("Let me help with that.") is None and free.why_not("It costs 40 dollars.") is not None


def test_the_disputed_choices_are_those_the_embedding_path_puts_well_behind():
    assert HybridTriage.disputed([("technical", 0.51), ("outage", 0.45), ("billing", 0.14)]) == {"outage", "billing"}
    assert HybridTriage.disputed([("outage", 0.47), ("technical", 0.44)]) == frozenset()
    assert HybridTriage.disputed([("billing", 0.30), ("outage", 0.10)]) == frozenset()  # too far to judge
    # a bare "yes" cannot pick a route, unless it answers something the agent asked at this node
    assert HybridTriage.disputed([("billing", 0.30)], request("yes")) == set(CHOICES)
    asked = request("yes", history=(("caller", "a charge on my statement"), ("agent", "Is this about billing?")))
    assert HybridTriage.disputed([("billing", 0.30)], asked) == frozenset()
    assert HybridTriage.disputed([("billing", 0.30)], request("my router")) == frozenset()


def test_slot_rules_win_over_the_models_reading():
    req = request("can you come Monday week at ten to five", choices={}, today="2026-12-04, Friday",
                  slots={"day": Slot(type="date"), "at": Slot(type="time"), "ok": Slot(type="yes_no")})
    assert rule_slots(req) == {"day": "2026-12-14", "at": "16:50"}


def test_the_node_is_the_cached_prefix_and_a_turn_feeds_only_the_conversation():
    req = request("my wifi is slow", knowledge="Our shop opens at 9am.",
                  history=(("agent", "How can I help?"),))
    static, turn = system_prompt(req), turn_prompt(req)
    assert "Our shop opens at 9am." in static and "my wifi is slow" not in static
    assert "billing: Billing, charges" in static and "I was charged twice" in static
    assert turn.endswith("<|im_start|>assistant\nchoice:") and "my wifi is slow" in turn
    later = request("something else entirely", knowledge="Our shop opens at 9am.",
                    history=(("agent", "How can I help?"), ("caller", "my wifi is slow")))
    assert system_prompt(later) == static  # the same prefix every turn at this node


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from callcenter.dialog.local_llm import Admission
    a = Admission(1, Path(sys.argv[1]))
    fd = a.try_acquire()
    print("held" if fd is not None else "busy", flush=True)
    time.sleep(30)
""")


def test_admission_spans_processes_and_a_busy_model_falls_back_to_the_embedding_path(tmp_path):
    """Another process holds the machine's one model slot: the hybrid's unclear turn cannot start
    within its wait, and the embedding path answers at once (a clarifying question), counted."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        admission = Admission(1, tmp_path)
        with pytest.raises(LlmBusy):
            asyncio.run(admission.acquire(0.1))
        hybrid = HybridTriage(model=LocalLlm(admission=admission))
        spoken = []
        reply = asyncio.run(hybrid.reply(request("hmm I'm not sure really, something odd happened",
                                                 acknowledgement="One moment."), spoken.append))
        assert reply.via == "busy" and hybrid.counts["busy"] == 1
        # the acknowledgement came ACKNOWLEDGE_AFTER_S in, before the admission wait ran out
        assert ACKNOWLEDGE_AFTER_S < 0.4 and spoken[0] == "One moment. "
        assert reply.choice is None and spoken[1].startswith("Just to check")
        clear = asyncio.run(hybrid.reply(request("I was charged twice"), spoken.append))
        assert clear.via == "embedding" and clear.choice == "billing"  # clear cases never wait for the model
    finally:
        holder.kill()
        holder.wait()
    fd = Admission(1, tmp_path).try_acquire()  # the holder's death freed the slot
    assert fd is not None
    Admission.release(fd)


class _Judged:
    """Stands in for the loaded model's one number (log P(the message ends here)); records what it was asked."""

    def __init__(self, logp: float):
        self.logp, self.asked = logp, []

    def end_logprob(self, words: str) -> float:
        self.asked.append(words)
        return self.logp


def test_the_end_of_turn_judge_reads_words_only_and_never_waits_for_a_busy_model(tmp_path):
    """Whisper's punctuation is not read (it writes a full stop after a cut-off sentence too); a judge
    that finds the model's slot taken answers "not judged" at once, and the slot is given back."""
    sure, unsure = _Judged(FINISHED_LOGP + 0.5), _Judged(FINISHED_LOGP - 0.5)
    admission = Admission(1, tmp_path)
    assert EndOfTurn(sure, admission)("Do you sell phones in your shops?") is True
    assert sure.asked == ["do you sell phones in your shops"]
    assert EndOfTurn(unsure, admission)("I need to reset my.") is False
    assert EndOfTurn(sure, admission)(" ... ") is False and len(sure.asked) == 1  # no words: not asked
    fd = admission.try_acquire()
    try:
        assert EndOfTurn(sure, admission)("Do you sell phones?") is False and len(sure.asked) == 1
    finally:
        Admission.release(fd)
    assert EndOfTurn(sure, admission)("Do you sell phones?") is True


def test_only_the_offline_model_judges_the_end_of_a_turn(monkeypatch, tmp_path):
    """The embedding path alone and the remote providers have no judge (the node's silence ends a
    turn); the hybrid and local-llm share the model's."""
    from callcenter.dialog import local_llm
    from callcenter.dialog.flow import load_flow
    from callcenter.dialog.services import FlowServices

    path = tmp_path / "flow.yaml"
    path.write_text(textwrap.dedent("""
        name: judged
        start: ask
        llm:
          remote: {kind: openai, model: m, base_url: "http://127.0.0.1:9/v1", api_key_env: NO_SUCH_KEY}
          model: {kind: local-llm}
        nodes:
          ask: {type: llm, prompt: "Hello?", instructions: Help., max_turns: 1, next: bye, on_failure: bye}
          bye: {type: hangup}
    """))
    flow = load_flow(path)
    monkeypatch.setattr(local_llm, "installed", lambda: False)
    services = FlowServices(flow)
    assert services.end_of_turn("default") is None
    assert services.end_of_turn("remote") is None
    assert isinstance(services.end_of_turn("model"), EndOfTurn)
    monkeypatch.setattr(local_llm, "installed", lambda: True)
    monkeypatch.delenv(local_llm.OFF_ENV, raising=False)  # the suite keeps the hybrid off unless asked
    hybrid = FlowServices(flow).provider("default")
    assert isinstance(hybrid, HybridTriage) and hybrid.end_of_turn is hybrid.model.end_of_turn


def test_a_reassembled_model_with_the_wrong_checksum_is_refused(tmp_path, monkeypatch):
    from callcenter.dialog import llm_model

    parts = []
    for i in range(3):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(bytes([i]) * 1000)
        parts.append(p)
    monkeypatch.setattr(llm_model, "part_files", lambda: parts)
    out = tmp_path / "model.gguf"
    with pytest.raises(LlmModelError, match="SHA-256"):
        llm_model.assemble(out)
    assert not out.exists()


needs_model = pytest.mark.skipif(not installed(), reason="the offline model is not built (callcenter llm build)")


@needs_model
@pytest.mark.slow
def test_a_model_turn_streams_sentences_and_routes():
    spoken = []
    reply = asyncio.run(LocalLlm().reply(request("there's a charge on my statement I don't recognise"),
                                         spoken.append))
    assert reply.choice == "billing", reply
    assert reply.text == "" and spoken == []  # a routing turn: the choice's next node speaks
    answer = asyncio.run(LocalLlm().reply(request("when do you open?", choices={},
                                                  knowledge="The shop on Main Street opens at 9am and closes at 6pm."),
                                          spoken.append))
    assert "9" in answer.text or "nine" in answer.text.lower(), answer
    assert "".join(spoken).strip() == answer.text  # streamed a sentence at a time
    unknown = asyncio.run(LocalLlm().reply(request("do you sell phones there?", choices={},
                                                   knowledge="The shop on Main Street opens at 9am and closes at 6pm."),
                                           spoken.append))
    assert "don't have that information" in unknown.text, unknown  # nothing made up


@needs_model
@pytest.mark.slow
def test_the_hybrid_sends_only_unclear_turns_to_the_model():
    hybrid = HybridTriage()
    said = []
    clear = asyncio.run(hybrid.reply(request("I was charged twice"), said.append))
    unclear = asyncio.run(hybrid.reply(request("the lights on my box keep blinking red"), said.append))
    assert clear.via == "embedding" and unclear.via in ("model", "unsure")
    assert unclear.choice in (None, "technical")


@needs_model
@pytest.mark.slow
def test_a_model_too_slow_for_the_nodes_budget_leaves_the_answer_to_the_embedding_path():
    hybrid = HybridTriage()
    said = []
    reply = asyncio.run(hybrid.reply(request("hmm, something odd happened with the thing", time_budget_s=0.3),
                                     said.append))
    assert reply.via == "slow" and said and said[0].startswith("Just to check")
    fd = hybrid.model.admission.try_acquire()  # the cancelled turn gave its slot back
    assert fd is not None
    Admission.release(fd)


@needs_model
@pytest.mark.slow
def test_knowledge_answers_come_from_the_facts_and_nothing_is_made_up():
    """bench nlu's 20 questions: 10 the facts answer, 10 they do not (the answer must be that the
    agent does not have that information, or a question back)."""
    from callcenter.lab.bench.dialog import KnowledgeScorer

    report = KnowledgeScorer().score()
    assert report["answered_right"] in ("9/10", "10/10"), report["cases"]
    assert report["invented"] == 0, report["cases"]


@needs_model
@pytest.mark.slow
def test_the_model_tells_a_finished_sentence_from_one_cut_at_a_pause():
    judge = EndOfTurn()
    for finished, cut in [("Do you sell phones in your shops?", "Do you sell phones in your."),
                          ("Hmm, I have a question about something.", "Hmm, I have a question about."),
                          ("My internet is not working.", "My internet is."),
                          ("What time do you close on Saturday?", "What time do you close on the.")]:
        assert judge(finished), finished
        assert not judge(cut), cut
