from pathlib import Path

from callcenter.dialog.engine import Dialog, Hangup, Listen, Say, Transfer
from callcenter.dialog.nlu import IntentMatcher


def says(actions):
    return [a.text for a in actions if isinstance(a, Say)]


def test_start_greets_then_asks(flow):
    d = Dialog(flow)
    actions = d.start()
    assert says(actions)[0] == "Thank you for calling Example Telecom."
    assert isinstance(actions[-1], Listen) and d.node_name == "main_menu"


def test_spoken_billing_request(flow):
    d = Dialog(flow)
    d.start()
    actions = d.on_utterance("Hi, I have a question about my bill.")
    assert d.last_decision.intent == "billing"
    assert "For billing" in says(actions)[0]
    assert d.node_name == "anything_else"


def test_keypad_is_deterministic(flow):
    for digit, intent in [("1", "billing"), ("2", "technical")]:
        d = Dialog(flow)
        d.start()
        d.on_dtmf(digit)
        assert d.last_decision.intent == intent and d.last_decision.via == "keypad"


def test_operator_transfer(flow):
    d = Dialog(flow)
    d.start()
    actions = d.on_dtmf("0")
    assert actions[-1] == Transfer("sip:operator@127.0.0.1:5099") and d.finished


def test_no_match_reprompts_then_escalates(flow):
    d = Dialog(flow)
    d.start()
    first = d.on_utterance("purple elephants")
    assert says(first)[0].startswith("Sorry, I didn't catch that.")
    d.on_no_input()
    last = d.on_utterance("banana")
    assert isinstance(last[-1], Transfer)  # three failed attempts → operator


def test_goodbye_hangs_up(flow):
    d = Dialog(flow)
    d.start()
    d.on_dtmf("1")
    actions = d.on_utterance("no thanks that's all")
    assert isinstance(actions[-1], Hangup) and "Goodbye" in says(actions)[-1]


def test_matcher_needs_a_clear_winner():
    m = IntentMatcher({"a": ["pay my bill"], "b": ["internet down"]})
    assert m.match("I'd like to pay my bill").intent == "a"
    assert m.match("my internet is down again").intent == "b"
    assert m.match("what a lovely day").intent is None
    assert m.match("").intent is None



def account_flow():
    from callcenter.dialog.flow import load_flow

    return load_flow(Path(__file__).parent / "flows" / "account.yaml")


def test_spoken_account_number_is_captured():
    d = Dialog(account_flow())
    listen = d.start()[-1]
    assert listen.kind == "digits" and (listen.digits_min, listen.digits_max) == (6, 8)
    d.on_utterance("Sure, it's four seven two, nine one eight three.")
    assert d.last_decision.intent == "number" and d.last_decision.value == "4729183"
    assert d.captured == {"number": "4729183"} and d.node_name == "confirm"


def test_keyed_account_number_ends_with_pound():
    d = Dialog(account_flow())
    d.start()
    for key in "47291":
        assert d.on_dtmf(key) == [] and d.collecting_keys
    d.on_dtmf("*")  # start again
    for key in "4729183#":
        actions = d.on_dtmf(key)
    assert d.captured["number"] == "4729183" and d.last_decision.via == "keypad" and d.node_name == "confirm"
    assert says(actions) == ["Thanks. Is that right?"]


def test_too_few_digits_reprompts_and_a_pause_in_keying_submits():
    d = Dialog(account_flow())
    d.start()
    d.on_utterance("four seven two")
    assert d.last_decision.via == "no_match" and d.node_name == "account"
    for key in "4729183":
        d.on_dtmf(key)
    d.on_no_input()  # the caller stopped keying
    assert d.captured["number"] == "4729183"


def test_yes_no_nodes_are_recognised_as_such():
    d = Dialog(account_flow())
    d.start()
    actions = d.on_utterance("4729183")
    assert actions[-1].kind == "yes_no"
    assert d.would_answer("yes it is") and not d.would_answer("what was that")


def test_an_unsure_recognition_is_reprompted(flow):
    d = Dialog(flow)
    d.start()
    actions = d.on_utterance("billing", confidence=0.1)
    assert d.last_decision.via == "low_confidence" and d.node_name == "main_menu"
    assert says(actions)[0].startswith("Sorry, I didn't catch that.")
    d.on_utterance("billing", confidence=0.9)
    assert d.last_decision.intent == "billing"
