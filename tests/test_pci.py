"""Card numbers (PCI DSS) through every door, whatever the flow's shape: a sensitive slot of an llm
node, a sensitive slot that comes second, a number volunteered at an earlier question, in words,
homophones, other scripts' digits and any separator; the recording and the supervisor's leg are
kept from a card number being given or read back."""

from __future__ import annotations

import asyncio

import pytest

from callcenter.audio.frames import FRAME_BYTES, AudioFrame
from callcenter.call.bridge import MediaBridge
from callcenter.call.events import CallEvents
from callcenter.dialog.engine import Dialog
from callcenter.dialog.flow import load_flow
from callcenter.dialog.redact import Redactor, mask_spoken_digits
from callcenter.text.pan import card_spans, luhn_ok, mask_cards

CARD = "4111111111111111"
SECOND_SLOT = """
name: second
start: details
nodes:
  details:
    type: ask
    prompt: Your name and card number please.
    on_failure: bye
    slots:
      name: {type: text}
      card: {type: digits, min_length: 16, max_length: 16, checksum: luhn}
    next: bye
  bye: {type: hangup, text: Goodbye.}
"""
LLM_SLOT = """
name: llm-card
start: help
nodes:
  help:
    type: llm
    prompt: How can I help?
    instructions: Take the caller's card number for the payment.
    slots:
      card: {type: digits, min_length: 16, max_length: 16, checksum: luhn}
    next: bye
    on_failure: bye
  bye: {type: hangup, text: Goodbye.}
"""
VOLUNTEERED = """
name: volunteer
start: why
nodes:
  why:
    type: ask
    prompt: What is your call about?
    on_failure: bye
    intents:
      pay: {examples: [I want to pay, a payment], next: bye}
  bye: {type: hangup, text: Goodbye.}
"""


@pytest.mark.parametrize("text", [
    "4111111111111111", "4111 1111 1111 1111", "4111-1111-1111-1111", "4111:1111_1111+1111",
    "(4111) 1111.1111/1111", "４１１１１１１１１１１１１１１１",  # fullwidth
    "٤١١١١١١١١١١١١١١١",  # Arabic-Indic digits
    "four one one one one one one one one one one one one one one one",
    "for won won won, won won won won, won won won won, won won won won",
    "four double one one, one one one one, triple one one, one one one one",
])
def test_a_card_number_is_found_in_any_spelling(text):
    masked = mask_cards(f"my card is {text} thanks")
    assert len(card_spans(text)) == 12  # every digit but the last four ("double one" is two)
    assert masked.startswith("my card is ") and masked.endswith(" thanks")
    assert masked.count("*") == len({(s, e) for s, e, _ in card_spans(text)})
    assert not any(c.isdigit() for c in masked[:-len(" thanks") - 8].replace("*", ""))


def test_what_is_not_a_card_is_left_alone():
    assert luhn_ok(CARD) and not luhn_ok("4111111111111113")
    for text in ("call me on 4155550100", "order 12 and 34", "4111111111111113", "born 1985, zip 94107",
                 "I'd like to speak to someone for one minute"):
        assert mask_cards(text) == text


def test_the_caller_id_and_declared_account_numbers_are_exempt():
    r = Redactor({"account"})
    event = {"caller_number": CARD, "account": CARD, "text": f"my card {CARD}", "slots": {"account": CARD}}
    out = r.scrub(event)
    assert out["caller_number"] == CARD and out["account"] == CARD and out["slots"]["account"] == CARD
    assert CARD not in out["text"]


def test_homophones_and_nought_are_masked_while_collecting():
    assert "for" not in mask_spoken_digits("for won ate niner nought").split()
    assert mask_spoken_digits("for won ate niner nought") == "* * * * *"


def _dialog(tmp_path, text: str) -> tuple[Dialog, CallEvents]:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    d = Dialog(load_flow(path), encoder=None)
    events = CallEvents("c1", tmp_path / "c1.jsonl")
    events.scrub = d.redactor.scrub
    d.start()
    return d, events


def test_a_sensitive_slot_that_comes_second_counts_as_collecting(tmp_path):
    d, _ = _dialog(tmp_path, SECOND_SLOT)
    assert d.collecting_sensitive  # the card is missing, though the name is asked first


def test_a_sensitive_slot_of_an_llm_node_counts_as_collecting(tmp_path):
    d, _ = _dialog(tmp_path, LLM_SLOT)
    assert d.collecting_sensitive


def test_a_volunteered_card_number_never_reaches_the_events(tmp_path):
    d, events = _dialog(tmp_path, VOLUNTEERED)
    assert not d.collecting_sensitive
    said = "I want to pay with four one one one one one one one one one one one one one one one"
    events.emit("stt_partial", text="my card is 4111 1111 1111 11")
    events.emit("stt_final", text=said)
    events.emit("stt_final", text=f"it is {CARD}")
    d.on_utterance(said)
    events.close()
    stored = (tmp_path / "c1.jsonl").read_text()
    assert CARD not in stored and "one one one one one one one one" not in stored
    assert d.variables["last_utterance"].count("*") >= 12


def test_events_without_a_flow_still_mask_cards(tmp_path):
    events = CallEvents("c2", tmp_path / "c2.jsonl")  # no redactor (a call before its flow starts)
    events.emit("stt_final", text=f"card {CARD}")
    events.close()
    assert CARD not in (tmp_path / "c2.jsonl").read_text()


def test_the_bridge_says_when_a_card_is_given_or_read_back():
    """The signal that mutes a listening supervisor: on while the caller gives the value (the
    recording's caller side is silent then) and while a private read-back is queued or playing."""

    async def main():
        bridge = MediaBridge(asyncio.get_running_loop(), None)
        seen = []
        bridge.on_privacy(seen.append)
        bridge.private_caller = True
        bridge.private_caller = False
        frame = AudioFrame(b"\x01\x00" * (FRAME_BYTES // 2))
        bridge.play(frame, 7, first=True, private=True)
        assert bridge.private and seen == [True, False, True]
        bridge.play(frame, 7, private=True)
        bridge.end_utterance(7)
        bridge.agent_frame()
        bridge.agent_frame()
        await asyncio.sleep(0.01)
        assert not bridge.private and seen == [True, False, True, False]
        bridge.play(frame, 8, first=True, private=True)
        bridge.flush()  # a barge-in drops it: the supervisor hears again
        assert seen[-1] is False and not bridge.private

    asyncio.run(main())


def test_a_flows_own_names_never_collide_with_an_events_parameters(tmp_path):
    """A slot named `at` (flows/appointments.yaml has one) once crashed the turn on a live call:
    `emit(kind, at=...)` took it for the event's time. Now no name is a parameter of `emit`, and an
    event's own fields (kind, t, turn …) are never displaced by data of the same name."""
    import json

    events = CallEvents("c3", tmp_path / "c3.jsonl")
    events.emit("flow_decision", at="10:30", kind="slot value", turn="mine", node="book")
    events.emit_at("first_rtp_out", 1.25, utterance=1)
    events.close()
    first, second = [json.loads(line) for line in (tmp_path / "c3.jsonl").read_text().splitlines()]
    assert first["kind"] == "flow_decision" and first["at"] == "10:30" and first["turn"] == 0
    assert second["t"] == 1.25


def test_a_hosted_model_never_receives_a_card_number():
    """What an llm node sends to a hosted model (OpenAI, Anthropic, Bedrock) passes the detector: a
    caller who says their card number at an llm node, or earlier, is masked in the messages."""
    from callcenter.dialog.engine import LlmRequest
    from callcenter.dialog.llm import _messages

    request = LlmRequest(node="help", provider="default", instructions="", knowledge=None, choices={}, slots={},
                         tools={}, history=(("caller", f"my card is {CARD}"), ("agent", "Thanks.")),
                         utterance="it is four one one one one one one one one one one one one one one one",
                         time_budget_s=5, fallback="Sorry.")
    sent = " ".join(m["content"] for m in _messages(request))
    assert CARD not in sent and "one one one one one one one one" not in sent and "1111" in sent
