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
