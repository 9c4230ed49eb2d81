"""The flow language: safe expressions and templates, slot parsers, the checker's located errors,
the JSON Schema, and the engine on every node kind."""

import datetime as dt
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from callcenter.dialog.engine import Dialog, Fetch, FlowError, Listen, LlmReply, Record, Say, Think, Transfer
from callcenter.dialog.expr import ExprError, parse_expr, render, template_names
from callcenter.dialog.flow import flow_schema, load_flow
from callcenter.dialog.slots import extract, luhn_ok, parse_currency, parse_date, parse_number, parse_time, parse_yes_no
from callcenter.yamlfile import UserFileError, YamlLoader

FLOWS = Path(__file__).resolve().parent.parent / "flows"
WED = dt.datetime(2026, 12, 2, 10, 0)


# ------------------------------------------------------------------ expressions and templates
@pytest.mark.parametrize("source,variables,expected", [
    ("hour >= 18 or weekday in ['sat', 'sun']", {"hour": 20, "weekday": "wed"}, True),
    ("hour >= 18 or weekday in ['sat', 'sun']", {"hour": 10, "weekday": "wed"}, False),
    ("hour >= 18 or weekday in ['sat', 'sun']", {"hour": 10, "weekday": "sun"}, True),
    ("not verified and attempts < 3", {"verified": False, "attempts": 1}, True),
    ("account == '47219183'", {"account": "47219183"}, True),
    ("amount > 100", {"amount": "250.00"}, True),  # slot text compared as a number
    ("amount > 100", {"amount": None}, False),  # a missing value is not greater than anything
    ("9 <= hour < 18", {"hour": 12}, True),
    ("plan in ['gold', 'silver']", {}, False),
    ("total + 1 == 3", {"total": 2}, True),
    ("vip == true", {"vip": True}, True),
])
def test_conditions(source, variables, expected):
    assert parse_expr(source).truth(variables) is expected


@pytest.mark.parametrize("source", [
    "__import__('os').system('id')", "open('/etc/passwd')", "caller.__class__", "x[0]", "lambda: 1",
    "[x for x in y]", "a if b else c", "x := 1", "f'{x}'", "2 ** 100000",
])
def test_conditions_cannot_run_code(source):
    with pytest.raises(ExprError):
        parse_expr(source)


def test_arithmetic_is_for_numbers_only():
    assert parse_expr("'x' * 1000000000 == 'y'").truth({}) is False  # refused, not a gigabyte string
    assert parse_expr("total * 2").eval({"total": "21"}) == 42.0
    with pytest.raises(TypeError):
        parse_expr("name * 3").eval({"name": "Dana"})


def test_templates():
    v = {"name": "Dana", "account": "47219183", "vip": True, "n": 3.0}
    assert render("Hi {name}, account {account|digits}.", v) == "Hi Dana, account 4 7 2 1 9 1 8 3."
    assert render("{{literal}} {missing} {vip} {n}", v) == "{literal} yes 3"
    assert [p.name for p in template_names("{a} and {b|digits}")] == ["a", "b"]
    for bad in ("{a|shout}", "{a.b}", "{unclosed", "{}"):
        with pytest.raises(ExprError):
            template_names(bad)


def test_url_templates_encode_values_but_not_the_base():
    v = {"base": "http://127.0.0.1:8088", "q": "a b/c&d"}
    enc = lambda s: s.replace(" ", "%20").replace("/", "%2F").replace("&", "%26")  # noqa: E731
    assert render("{base}/find?q={q}", v, encode=enc, raw={"base"}) == "http://127.0.0.1:8088/find?q=a%20b%2Fc%26d"
    # a leading value the flow's author does not own is encoded like any other: it cannot pick the host
    assert render("{base}/find", v, encode=enc) == "http:%2F%2F127.0.0.1:8088/find"


# ------------------------------------------------------------------ slots
def test_slot_parsers():
    today = WED.date()
    assert parse_number("twenty five") == 25 and parse_number("one hundred and five") == 105
    assert parse_number("two point five") == 2.5 and parse_number("I have 3 phones") == 3
    assert parse_yes_no("yes please") is True and parse_yes_no("no it isn't") is False
    assert parse_yes_no("maybe") is None
    assert parse_date("tomorrow", today) == "2026-12-03"
    assert parse_date("next friday", today) == "2026-12-04"
    assert parse_date("December 10th", today) == "2026-12-10"
    assert parse_date("the third of january", today) == "2027-01-03"
    assert parse_date("the 5th", today) == "2026-12-05"
    assert parse_date("whenever", today) is None
    assert parse_time("3 pm") == "15:00" and parse_time("half past ten in the morning") == "10:30"
    assert parse_time("10:45") == "10:45" and parse_time("noon") == "12:00"
    assert parse_time("quarter to five") == "16:45" and parse_time("at 2") == "14:00"
    assert parse_currency("$25.50") == "25.50"
    assert parse_currency("twenty five dollars and fifty cents") == "25.50"
    assert parse_currency("about forty bucks") == "40.00"
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")
    assert extract("digits", "seven nine nine two seven three nine eight seven one three", checksum="luhn",
                   min_length=11, max_length=11) == "79927398713"
    assert extract("digits", "7992 7398 710", checksum="luhn", min_length=11, max_length=11) is None
    assert extract("number", "fifty", min=1, max=10) is None


# ------------------------------------------------------------------ the checker
def problems(tmp_path, text: str) -> list[str]:
    p = tmp_path / "flow.yaml"
    p.write_text(textwrap.dedent(text))
    with pytest.raises(UserFileError) as exc:
        load_flow(p)
    return exc.value.problems


BASE = """\
name: t
start: ask
nodes:
  ask:
    type: ask
    prompt: Which one, {name}?
    intents:
      a: {examples: [alpha], next: done}
      b: {examples: [beta], next: done}
    on_failure: done
  done:
    type: hangup
    text: Bye.
"""


def test_checker_finds_every_kind_of_problem_with_its_line(tmp_path):
    ps = problems(tmp_path, BASE.replace("[beta]", "[alpha]").replace("next: done}\n    on", "next: gone}\n    on")
                  + """\
  loop_a:
    type: set
    values: {x: 1}
    next: loop_b
  loop_b:
    type: branch
    cases:
      - if: x > 0 and y
        next: loop_a
    else: done
""")
    f = tmp_path / "flow.yaml"
    assert f"{f}:6:5: unknown variable 'name' in template" in ps
    assert any(p.startswith(f"{f}:9:") and "unknown node 'gone'" in p for p in ps), ps
    assert any(p.startswith(f"{f}:9:") and "phrase 'alpha' is also an example of 'a'" in p for p in ps), ps
    assert any(":14:3:" in p and "node 'loop_a' is unreachable" in p for p in ps), ps
    assert any(":21:9:" in p and "unknown variable 'y' in condition" in p for p in ps), ps
    assert any("a cycle without any caller input: loop_a -> loop_b -> loop_a" in p for p in ps), ps


def test_checker_shape_errors(tmp_path):
    f = tmp_path / "flow.yaml"
    ps = problems(tmp_path, BASE.replace("    prompt: Which one, {name}?\n", ""))
    assert f"{f}:4:3: nodes.ask.prompt: Field required" in ps, ps
    ps = problems(tmp_path, BASE.replace("type: hangup", "type: hangupp"))
    assert any(":12:5: nodes.done.type: Input tag 'hangupp'" in p for p in ps), ps
    ps = problems(tmp_path, BASE.replace("    intents:\n", "    slots:\n      n: {type: colour}\n    next: done\n"
                                         "    intents:\n"))
    assert any(":8:" in p and "slots.n.type" in p for p in ps), ps
    ps = problems(tmp_path, "name: t\nvoice: ssm:nobody\n" + BASE.split("\n", 1)[1])
    assert any(p.startswith(f"{f}:2:") and "unknown voice 'ssm:nobody'" in p for p in ps), ps
    ps = problems(tmp_path, BASE.replace("start: ask", "start: [ask"))
    assert ps[0].startswith(f"{f}:") and "invalid YAML" in ps[0]
    ps = problems(tmp_path, BASE.replace("    type: branch", "") + """\
  b:
    type: branch
    cases: [{if: "__import__('os')", next: done}]
    else: done
""")
    assert any("call is not allowed" in p for p in ps), ps


def test_llm_and_transfer_checks(tmp_path):
    ps = problems(tmp_path, BASE + """\
  l:
    type: llm
    provider: cloud
    choices: {x: {description: X, next: done}}
    tools: {escalate: {type: transfer, to: "not a uri"}}
    on_failure: done
  t:
    type: transfer
    queue: nowhere
""")
    assert any("not a SIP URI" in p for p in ps), ps
    ps = problems(tmp_path, BASE + """\
  l:
    type: llm
    provider: cloud
    choices: {x: {description: X, next: done}}
    on_failure: done
  t:
    type: transfer
    queue: nowhere
""")
    assert any("unknown provider 'cloud'" in p for p in ps), ps
    assert any("unknown queue 'nowhere'" in p for p in ps), ps


def test_example_flows_pass_the_checker_and_the_schema():
    schema = flow_schema()
    for path in sorted(FLOWS.glob("*.yaml")):
        load_flow(path)
        jsonschema.validate(yaml.load(path.read_text(), Loader=YamlLoader), schema)
    kinds = {v["properties"]["type"]["const"] for k, v in schema["$defs"].items() if k.endswith("Node")}
    assert kinds == {"say", "ask", "menu", "branch", "set", "webhook", "llm", "transfer", "voicemail", "hangup",
                     "subflow", "return"}


def test_flows_schema_command():
    out = subprocess.run([sys.executable, "-m", "callcenter.cli", "flows", "schema"], capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out)["title"] == "callcenter flow"


# ------------------------------------------------------------------ the engine
def flow_of(tmp_path, text: str):
    p = tmp_path / "flow.yaml"
    p.write_text(textwrap.dedent(text))
    return load_flow(p)


def says(actions) -> str:
    return " ".join(a.text for a in actions if isinstance(a, Say))


def test_triage_flow_end_to_end_in_the_engine():
    d = Dialog(load_flow(FLOWS / "triage.yaml"), now=WED)
    acts = d.start()
    assert "how can I help" in says(acts) and isinstance(acts[-1], Listen)
    (think,) = d.on_utterance("I was charged twice this month")
    assert isinstance(think, Think) and think.request.choices["billing"][0].startswith("Billing")
    with pytest.raises(FlowError):
        d.on_utterance("hello?")  # the model has not answered yet
    acts = d.on_thought(LlmReply(choice="billing"))
    assert "account number" in says(acts) and acts[-1].kind == "digits" and acts[-1].digits_max == 8
    assert d.on_dtmf("4") == [] and d.on_dtmf("0") == []  # 0 is a digit here, not the operator
    for k in "219183":
        acts = d.on_dtmf(k)
    (say, fetch) = acts
    assert isinstance(fetch, Fetch) and fetch.url == "http://127.0.0.1:8088/accounts/40219183"
    acts = d.on_fetched(200, {"customer": {"first_name": "Dana"}, "plan": {"name": "Fibre"}})
    assert says(acts).startswith("Thanks Dana. I can see your Fibre plan.")
    assert acts[-1] == Transfer("sip:billing@127.0.0.1:5099")
    assert d.path[-4:] == ["lookup", "found", "route", "to_billing"]


def test_llm_replies_are_held_to_the_nodes_allow_lists():
    d = Dialog(load_flow(FLOWS / "triage.yaml"), now=WED)
    d.start()
    d.on_utterance("transfer me to the admin line")
    acts = d.on_thought(LlmReply(text="Sure.", tool="transfer_admin", choice="admin"))
    assert not any(isinstance(a, Transfer) for a in acts) and isinstance(acts[-1], Listen)
    assert d.last_decision.detail["rejected"] == ["tool 'transfer_admin' is not allowed here",
                                                  "choice 'admin' is not one of ['billing', 'outage', 'technical']"]
    d.on_utterance("whatever")
    acts = d.on_thought(None, "timeout")
    assert says(acts).startswith("Sorry, I'm having trouble") and acts[-1] == Transfer("sip:operator@127.0.0.1:5099")


def test_llm_tools_transfer_only_to_their_own_destination(tmp_path):
    flow = flow_of(tmp_path, """\
        name: t
        start: l
        nodes:
          l:
            type: llm
            choices: {x: {description: X, next: bye}}
            tools: {human: {type: transfer, to: "sip:desk@127.0.0.1"}}
            slots: {amount: {type: currency}}
            on_failure: bye
          bye: {type: hangup}
        """)
    d = Dialog(flow, encoder=None)
    d.start()
    d.on_utterance("refund forty dollars and get me a human")
    acts = d.on_thought(LlmReply(tool="human", tool_args={"to": "sip:admin@evil"}, slots={"amount": "forty bucks",
                                                                                           "pin": "1234"}))
    assert acts == [Transfer("sip:desk@127.0.0.1")]
    assert d.variables["amount"] == "40.00" and "pin" not in d.variables


def test_menu_set_branch_and_globals(tmp_path):
    flow = flow_of(tmp_path, """\
        name: t
        variables: {tier: ""}
        globals:
          intents: {human: {keypad: "0", examples: [operator], next: desk}}
          max_no_match: 3
          on_no_match: desk
        start: menu
        nodes:
          menu:
            type: menu
            prompt: Main menu.
            options:
              - {key: "1", label: sales, next: gold}
              - {key: "2", label: support, next: check}
            on_failure: desk
          gold:
            type: set
            values: {tier: gold}
            compute: {doubled: "2 * 21"}
            next: check
          check:
            type: branch
            cases: [{if: "tier == 'gold' and doubled == 42", next: vip}]
            else: menu
          vip: {type: hangup, text: "Welcome {tier} member."}
          desk: {type: transfer, to: "sip:desk@127.0.0.1"}
        """)
    d = Dialog(flow, encoder=None)
    assert says(d.start()) == "Main menu. For sales, press 1. For support, press 2."
    assert says(d.on_dtmf("1")) == "Welcome gold member."
    d = Dialog(flow, encoder=None)
    d.start()
    assert d.on_utterance("operator")[-1] == Transfer("sip:desk@127.0.0.1")
    d = Dialog(flow, encoder=None)
    d.start()
    d.on_utterance("banana")
    d.on_dtmf("2")  # support -> check -> back to the menu: attempts start again, the call's count does not
    d.on_utterance("banana")
    assert d.on_utterance("banana")[-1] == Transfer("sip:desk@127.0.0.1")  # the third no-match in the call


def test_slots_fill_in_any_order_with_their_own_prompts():
    d = Dialog(load_flow(FLOWS / "appointments.yaml"), now=WED)
    d.start()
    acts = d.on_utterance("tomorrow please")
    assert says(acts) == "And at what time?" and d.variables["day"] == "2026-12-03"
    acts = d.on_utterance("um")
    assert says(acts) == "Sorry, I didn't get that. And at what time?"
    acts = d.on_utterance("10 in the morning")
    assert says(acts) == "That's 2026-12-03 at 10:00. Shall I book it?"


def test_voicemail_and_transfer_failure(tmp_path):
    d = Dialog(load_flow(FLOWS / "after_hours.yaml"), now=dt.datetime(2026, 12, 5, 11))
    d.start()
    acts = d.on_dtmf("1")
    assert isinstance(acts[-1], Record) and acts[-1].max_s == 60 and acts[-1].beep
    assert "call you back" in says(d.on_recorded("/x/vm.wav", 12.5))
    d = Dialog(load_flow(FLOWS / "after_hours.yaml"), now=WED.replace(hour=11))
    assert d.start()[-1] == Transfer("sip:frontdesk@127.0.0.1:5099") and not d.finished
    assert "office is closed" in says(d.on_transfer_failed())


def test_escalating_reprompts():
    d = Dialog(load_flow(FLOWS / "triage.yaml"), now=WED)
    d.start()
    d.on_utterance("billing")
    d.on_thought(LlmReply(choice="billing"))
    assert says(d.on_utterance("I don't know")).startswith("Your account number is on the top of your bill")
    assert says(d.on_utterance("no idea")).startswith("Let's try once more")


def test_warm_transfer_carries_its_rendered_summary(tmp_path):
    flow = flow_of(tmp_path, """\
        name: t
        start: ask
        nodes:
          ask:
            type: ask
            prompt: Account?
            slots: {account: {type: digits, min_length: 4, max_length: 4}}
            next: warm
            on_failure: warm
          warm:
            type: transfer
            mode: warm
            to: sip:desk@127.0.0.1
            summary: Caller {caller_number} with account {account|digits}.
            ring_s: 15
        """)
    d = Dialog(flow, variables={"caller_number": "4155550100"}, encoder=None)
    d.start()
    (transfer,) = d.on_utterance("it's 4 7 2 1")
    assert transfer == Transfer("sip:desk@127.0.0.1", "warm", "Caller 4155550100 with account 4 7 2 1.", 15)
