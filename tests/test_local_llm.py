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
from callcenter.dialog.local_llm import (MIN_CHOICE_P, Admission, HybridTriage, LlmBusy, LocalLlm, ReplyParser,
                                         system_prompt, turn_prompt)

CHOICES = {"billing": ("Billing, charges, payments or refunds", ("my bill", "I was charged twice")),
           "technical": ("Technical support with a device or connection", ("my router does not work",)),
           "outage": ("An outage or no service in an area", ("is the network down",))}


def request(utterance: str, **over) -> LlmRequest:
    base = dict(node="triage", provider="local", instructions="You route callers of Example Telecom.",
                knowledge=None, choices=CHOICES, slots={}, tools={}, history=(), utterance=utterance,
                time_budget_s=8, fallback="Sorry.")
    base.update(over)
    return LlmRequest(**base)


def test_the_reply_is_read_as_it_streams_and_held_to_the_nodes_lists():
    req = request("I was billed twice", slots={"account": Slot(type="digits")},
                  tools={"to_person": LlmTool(type="transfer", to="sip:desk@127.0.0.1")})
    spoken = []
    parser = ReplyParser(req, spoken.append)
    for piece in (" bill", "ing\nacc", "ount: 4471\ntool: none\nsa", "y: \"Sure", ", let me check", " that.\""):
        parser.feed(piece)
        if "say" not in "".join(spoken):
            assert not any("bill" in s for s in spoken)  # nothing before say: reaches the voice
    reply = parser.close()
    assert reply.choice == "billing" and reply.slots == {"account": "4471"} and reply.tool is None
    assert reply.text == "Sure, let me check that." and "".join(spoken).startswith("Sure")
    # a choice or tool that is not the node's is dropped; an unsure choice says nothing
    odd = ReplyParser(req, lambda _: None)
    for piece in (" refunds\ntool: format_disk\nsay: Okay."):
        odd.feed(piece)
    out = odd.close()
    assert out.choice is None and out.tool is None
    quiet = []
    unsure = ReplyParser(req, quiet.append)
    unsure.confidence(MIN_CHOICE_P / 2)
    for piece in (" outage\n", "say: Let me put you through to our outage team."):
        unsure.feed(piece)
    assert unsure.unsure and quiet == []


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
        reply = asyncio.run(hybrid.reply(request("hmm I'm not sure really, something odd happened"), spoken.append))
        assert reply.via == "busy" and hybrid.counts["busy"] == 1
        assert reply.choice is None and spoken and spoken[0].startswith("Just to check")
        clear = asyncio.run(hybrid.reply(request("I was charged twice"), spoken.append))
        assert clear.via == "embedding" and clear.choice == "billing"  # clear cases never wait for the model
    finally:
        holder.kill()
        holder.wait()
    fd = Admission(1, tmp_path).try_acquire()  # the holder's death freed the slot
    assert fd is not None
    Admission.release(fd)


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
    assert reply.text and "".join(spoken).strip().strip('"') == reply.text
    answer = asyncio.run(LocalLlm().reply(request("when do you open?", choices={},
                                                  knowledge="The shop on Main Street opens at 9am and closes at 6pm."),
                                          spoken.append))
    assert "9" in answer.text or "nine" in answer.text.lower(), answer


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
