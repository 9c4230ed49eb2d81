"""Who may be dialled and with what: the allow-list, the deny-list, the trunk, and a dial's
variables against the flow (no built-in, no secret, no slot, only what the flow declares)."""

from __future__ import annotations

import pytest

from callcenter.dialog.flow import load_flow
from callcenter.telephony.config import Outbound, ServerConfig
from callcenter.telephony.outbound import DialRefused, destination, dial_variables

OUT = Outbound(allow=["+1555*", "sip:*@127.0.0.1:*"], deny=["+1555000*"], trunk="trunk.example:5060")


def test_a_number_goes_to_the_trunk_and_a_uri_straight():
    assert destination("+1 555-123-4567", OUT) == "sip:+15551234567@trunk.example:5060"
    assert destination("sip:dana@127.0.0.1:5070", OUT) == "sip:dana@127.0.0.1:5070"
    assert destination("5551234", Outbound(allow=["*"]), registrar_domain="pbx.example") == "sip:5551234@pbx.example"


@pytest.mark.parametrize("to, status, words", [
    ("+4420794600000", 403, "matches no pattern in outbound.allow"),
    ("+15550001234", 403, "refused by outbound.deny"),
    ("sip:dana@10.0.0.7", 403, "outbound.allow"),
    ("sip:x@127.0.0.1:5070\r\nVia: evil", 400, "neither a phone number"),
    ("dana", 400, "neither a phone number"),
    ("sip:<dana>@127.0.0.1", 400, "neither"),
])
def test_what_is_not_allowed_is_refused_with_why(to, status, words):
    with pytest.raises(DialRefused) as err:
        destination(to, OUT)
    assert err.value.status == status and words in str(err.value)


def test_nothing_is_dialled_by_default_and_a_number_needs_a_trunk():
    with pytest.raises(DialRefused, match="outbound.allow"):
        destination("sip:dana@127.0.0.1:5070", Outbound())
    with pytest.raises(DialRefused, match="needs outbound.trunk"):
        destination("+15551234567", Outbound(allow=["*"]))


def test_a_dials_variables_are_the_flows_own_declared_ones():
    flow = load_flow("flows/reminder.yaml")
    assert dial_variables({"name": "Dana", "day": 3}, flow) == {"name": "Dana", "day": "3"}
    for given, words in (({"caller": "x"}, "set by the call itself"), ({"direction": "inbound"}, "set by the call"),
                         ({"nickname": "D"}, "declares no variable 'nickname'"), ({"1x": "a"}, "letters, digits"),
                         ({"name": {"a": 1}}, "give text"), ({"name": "x" * 501}, "at most 500"),
                         ({"call_id": "../x"}, "set by the call itself")):
        with pytest.raises(DialRefused, match=words):
            dial_variables(given, flow)


def test_a_secret_from_the_environment_and_a_slot_cannot_be_given(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("name: f\nstart: a\nvariables: {who: ''}\nenv: [API_KEY]\nnodes:\n"
                    "  a: {type: ask, prompt: 'Your account number?', slots: {account: {type: digits}}, next: b, on_failure: b}\n"
                    "  b: {type: hangup, text: 'Bye {who}.'}\n")
    flow = load_flow(path)
    with pytest.raises(DialRefused, match="environment"):
        dial_variables({"API_KEY": "stolen"}, flow)
    with pytest.raises(DialRefused, match="slot"):
        dial_variables({"account": "123"}, flow)


def test_the_config_names_outbound_flows_relative_to_itself(tmp_path):
    from callcenter.telephony.config import load_server_config

    cfg_path = tmp_path / "sip.yaml"
    cfg_path.write_text("outbound:\n  flows: {reminder: flows/reminder.yaml}\n  allow: ['+1*']\n")
    cfg = load_server_config(cfg_path)
    assert cfg.outbound_flow("reminder") == tmp_path / "flows/reminder.yaml"
    with pytest.raises(KeyError):
        cfg.outbound_flow("other")
    with pytest.raises(ValueError, match="letters, digits"):
        ServerConfig.model_validate({"outbound": {"flows": {"../x": "a.yaml"}}})
