"""Failures a flow author used to meet in silence (issue 20): each is now a located error, a hint,
or the flow's own path at run time."""

import textwrap
from pathlib import Path

import pytest

from callcenter.dialog.engine import Dialog, Fetch, Say
from callcenter.dialog.expr import ExprError, parse_expr
from callcenter.dialog.flow import load_flow
from callcenter.yamlfile import UserFileError
from tests.test_flow import problems, write


def says(actions) -> str:
    return " ".join(a.text for a in actions if isinstance(a, Say))


REFILL = """\
name: refill
start: lookup
nodes:
  lookup:
    type: webhook
    url: https://pharmacy.example/rx/1234567
    save: {drug: refill.drug, ready: refill.ready_on}
    next: tell
    on_failure: sorry
  tell:
    type: say
    text: Your refill of {drug} will be ready on {ready}.
    next: bye
  sorry:
    type: say
    text: I could not find that prescription.
    next: bye
  bye:
    type: hangup
    text: Goodbye.
"""


def test_a_duplicate_node_is_an_error_at_its_line(tmp_path):
    ps = problems(tmp_path, REFILL.replace("  bye:\n", "  sorry:\n    type: hangup\n  bye:\n", 1))
    assert ps == [f"{tmp_path / 'flow.yaml'}:18:3: duplicate key 'sorry' (first at line 14); keys must be unique "
                  "in a mapping"]


def test_a_duplicate_field_is_an_error_too(tmp_path):
    ps = problems(tmp_path, REFILL.replace("    text: Goodbye.\n", "    text: Goodbye.\n    text: Bye.\n"))
    assert len(ps) == 1 and ":21:5: duplicate key 'text' (first at line 20)" in ps[0]


def test_a_missing_webhook_field_is_never_spoken_blank(tmp_path):
    d = Dialog(load_flow(write(tmp_path, REFILL)))
    (fetch,) = [a for a in d.start() if isinstance(a, Fetch)]
    spoken = says(d.on_fetched(200, {"refill": {"drug": "amoxicillin"}}))  # no ready_on
    assert spoken == "I could not find that prescription. Goodbye."
    assert d.last_decision.via == "webhook_missing" and d.last_decision.detail["missing"] == ["refill.ready_on"]


def test_on_missing_and_defaults(tmp_path):
    flow = REFILL.replace("    on_failure: sorry\n", "    on_failure: sorry\n    on_missing: partial\n"
                          "    defaults: {drug: your medicine}\n") + """\
  partial:
    type: say
    text: Your refill of {drug} is being prepared; we will text you when it is ready.
    next: bye
"""
    d = Dialog(load_flow(write(tmp_path, flow)))
    d.start()
    assert says(d.on_fetched(200, {"refill": {"ready_on": None}})).startswith(
        "Your refill of your medicine is being prepared")
    d = Dialog(load_flow(write(tmp_path, flow)))
    d.start()
    assert says(d.on_fetched(200, {"refill": {"ready_on": "Friday"}})).startswith(
        "Your refill of your medicine will be ready on Friday.")
    ps = problems(tmp_path, flow.replace("defaults: {drug: your medicine}", "defaults: {drugs: x}"))
    assert any("defaults for variables the node does not save: drugs" in p for p in ps)


CONFIRM = """\
name: confirm
start: confirm
nodes:
  confirm:
    type: ask
    prompt: Shall I order the refill?
    slots:
      ok: {type: yes_no, prompt: "Shall I order the refill? Yes or no."}
    next: decide
    on_failure: done
  decide:
    type: branch
    cases:
      - {when: ok, next: done}
    else: again
  again:
    type: say
    text: Let me ask once more.
    next: confirm
  done:
    type: hangup
    text: Ordered.
"""


def test_coming_back_to_a_question_asks_it_again(tmp_path):
    d = Dialog(load_flow(write(tmp_path, CONFIRM)))
    d.start()
    assert "Let me ask once more. Shall I order the refill?" in says(d.on_utterance("no"))
    assert says(d.on_utterance("yes")) == "Ordered."
    assert d.variables["ok"] is True


KEEP = """\
name: keep
start: confirm
nodes:
  confirm:
    type: ask
    prompt: Shall I order the refill?
    slots:
      ok: {type: yes_no, prompt: "Shall I order the refill? Yes or no."}
    next: decide
    on_failure: done
    reask: false
  decide:
    type: branch
    cases:
      - {when: ok, next: more}
    else: done
  more:
    type: ask
    prompt: Anything else?
    intents:
      review: {examples: [go over my order again], next: confirm}
      finish: {examples: [no that is all], next: done}
    on_failure: done
  done:
    type: hangup
    text: Goodbye.
"""


def test_reask_false_keeps_what_was_given(tmp_path):
    d = Dialog(load_flow(write(tmp_path, KEEP)))
    d.start()
    assert says(d.on_utterance("yes")) == "Anything else?"
    # back at the question: the earlier yes stands, so the flow goes straight on
    assert says(d.on_utterance("go over my order again")) == "Anything else?"
    assert d.path[-3:] == ["confirm", "decide", "more"]
    # the default (reask) asks again
    d = Dialog(load_flow(write(tmp_path, KEEP.replace("    reask: false\n", ""))))
    d.start()
    d.on_utterance("yes")
    assert says(d.on_utterance("go over my order again")) == "Shall I order the refill?"


def test_one_typo_is_one_line_with_a_suggestion(tmp_path):
    ps = problems(tmp_path, REFILL.replace("    next: tell\n", "    next: tel\n"))
    assert ps == [f"{tmp_path / 'flow.yaml'}:8:5: unknown node 'tel' (did you mean 'tell'?)"]


def test_nodes_cut_off_by_one_mistake_are_named_on_one_line(tmp_path):
    flow = REFILL + """\
  island:
    type: say
    text: Nobody comes here.
    next: island_end
  island_end:
    type: hangup
    text: Really nobody.
"""
    ps = problems(tmp_path, flow)
    assert ps == [f"{tmp_path / 'flow.yaml'}:21:3: node 'island' is unreachable from start 'lookup' "
                  "(and so are 'island_end', which only it leads to)"]


@pytest.mark.parametrize("source,hint", [
    ("hour >= 9 && hour < 17", "write `and` instead of `&&`"),
    ("closed || holiday", "write `or` instead of `||`"),
    ("!open", "write `not` instead of `!`"),
    ("plan = 'gold'", "write `==` to compare"),
    ("plan === 'gold'", "write `==` instead of `===`"),
])
def test_expression_errors_name_the_usual_mistake_and_column(source, hint):
    with pytest.raises(ExprError) as exc:
        parse_expr(source)
    assert hint in str(exc.value) and "at column" in str(exc.value)


def test_operators_inside_quotes_are_not_mistakes():
    assert parse_expr("name == 'a && b'").truth({"name": "a && b"})


def test_the_shipped_schema_is_current_and_every_flow_points_at_it():
    import json

    from callcenter.dialog.flow import flow_schema

    flows = Path(__file__).resolve().parent.parent / "flows"
    assert json.loads((flows / "flow.schema.json").read_text()) == flow_schema(), \
        "run: callcenter flows schema > flows/flow.schema.json"
    for path in sorted(flows.glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=flow.schema.json", path
    described = [(name, f) for name, d in [("Flow", flow_schema()), *flow_schema()["$defs"].items()]
                 for f, spec in d.get("properties", {}).items() if "description" not in spec and f != "type"]
    assert described == []


OPERATOR = """\
name: rx
start: number
globals:
  intents:
    operator: {examples: [a pharmacist please], keypad: "0", next: pharmacist}
nodes:
  number:
    type: ask
    prompt: Please key in your 7-digit prescription number.
    slots:
      rx: {type: digits, min_length: 7, max_length: 7, prompt: "Your 7-digit prescription number, please."}
    next: thanks
    on_failure: pharmacist
  thanks:
    type: hangup
    text: Thank you.
  pharmacist:
    type: transfer
    to: sip:pharmacist@127.0.0.1
"""


def test_the_operator_key_works_inside_a_digit_string(tmp_path):
    flow = load_flow(write(tmp_path, OPERATOR))
    assert flow.warnings == [f"{tmp_path / 'flow.yaml'}:11:7: warning: keypad 0 is the global intent 'operator': "
                             "pressed first here it goes there, not into the number (keypad_globals: false to "
                             "make it a digit)"]
    d = Dialog(flow)
    d.start()
    assert d.on_dtmf("0")[-1].to == "sip:pharmacist@127.0.0.1"
    # once keying has begun, 0 is a digit
    d = Dialog(flow)
    d.start()
    for key in "1203456":
        actions = d.on_dtmf(key)
    assert d.variables["rx"] == "1203456" and says(actions) == "Thank you."
    # keypad_globals: false makes the first 0 a digit too
    strict = load_flow(write(tmp_path, OPERATOR.replace("    next: thanks\n", "    next: thanks\n    keypad_globals: false\n")))
    assert "callers cannot reach 'operator' by key" in strict.warnings[0]
    d = Dialog(strict)
    d.start()
    for key in "0123456":
        actions = d.on_dtmf(key)
    assert d.variables["rx"] == "0123456"


HOURS = """\
name: pharmacy
start: gate
hours:
  timezone: Europe/London
  open:
    mon-fri: "09:00-17:30"
    sat: ["10:00-12:00", "13:00-16:00"]
  holidays: [2026-12-25]
nodes:
  gate:
    type: branch
    cases:
      - {if: open, next: welcome}
    else: closed_msg
  welcome:
    type: hangup
    text: We are open.
  closed_msg:
    type: hangup
    text: "We are closed{' for the holiday' if holiday else ''}."
"""


@pytest.mark.parametrize("when,is_open", [
    ("2026-12-02T10:00", True),              # Wednesday morning, London time
    ("2026-12-02T17:30", False),             # closing time is closed
    ("2026-12-05T12:30", False),             # Saturday lunch break
    ("2026-12-05T13:00", True),
    ("2026-12-06T11:00", False),             # Sunday: not named, closed
    ("2026-12-25T10:00", False),             # a Friday, but a holiday
    ("2026-12-02T09:30-05:00", True),        # 09:30 in New York is 14:30 in London: open
    ("2026-12-02T10:00+09:00", False),       # 10:00 in Tokyo is 01:00 in London: closed
])
def test_opening_hours_are_read_in_the_flows_time_zone(tmp_path, when, is_open):
    import datetime as dt

    flow = load_flow(write(tmp_path, HOURS.replace("{' for the holiday' if holiday else ''}", "")))
    d = Dialog(flow, now=dt.datetime.fromisoformat(when))
    assert d.variables["open"] is is_open and d.variables["closed"] is (not is_open)
    assert d.variables["holiday"] is when.startswith("2026-12-25")


def test_hours_mistakes_are_located(tmp_path):
    ps = problems(tmp_path, HOURS.replace("Europe/London", "Europe/Londn").replace('"09:00-17:30"', '"9-17"'))
    assert any(":4:3: hours.timezone: Value error, unknown time zone 'Europe/Londn'" in p for p in ps), ps
    assert any("hours.open" in p and "opening times are written 09:00-17:30" in p for p in ps), ps


def test_scenario_variables_must_exist_and_the_clock_comes_from_the_command_line(tmp_path):
    import subprocess
    import sys

    (tmp_path / "flow.yaml").write_text(HOURS.replace("{' for the holiday' if holiday else ''}", ""))
    (tmp_path / "test.yaml").write_text(textwrap.dedent("""\
        flow: flow.yaml
        scenarios:
          - name: a weekday morning
            at: 2026-12-02 10:00
            variables: {calller: "+441234"}
            steps: []
            expect: {said: [We are open]}
        """))
    r = subprocess.run([sys.executable, "-m", "callcenter.cli", "test", str(tmp_path / "test.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "'calller' is not a variable of flow.yaml (did you mean 'caller'?)" in r.stdout
    text = (tmp_path / "test.yaml").read_text().replace("calller", "caller")
    (tmp_path / "test.yaml").write_text(text)
    r = subprocess.run([sys.executable, "-m", "callcenter.cli", "test", str(tmp_path / "test.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    r = subprocess.run([sys.executable, "-m", "callcenter.cli", "test", str(tmp_path / "test.yaml"),
                        "--at", "2026-12-24T18:30 Europe/London"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "FAIL" in r.stdout  # closed on Christmas Eve evening


def test_scenarios_have_their_own_routes_and_check_what_the_webhook_sent(tmp_path):
    import subprocess
    import sys

    (tmp_path / "flow.yaml").write_text(REFILL.replace(
        "    url: https://pharmacy.example/rx/1234567\n",
        "    url: \"{rx_api}/rx/{caller_number}\"\n    method: POST\n    body: {store: leeds, who: \"{caller_number}\"}\n")
        .replace("name: refill\n", "name: refill\nvariables: {rx_api: 'http://127.0.0.1:9'}\n"))
    (tmp_path / "test.yaml").write_text(textwrap.dedent("""\
        flow: flow.yaml
        http:
          variable: rx_api
          routes:
            /rx/4471: {json: {refill: {drug: amoxicillin, ready_on: Friday}}}
        scenarios:
          - name: found
            variables: {caller_number: "4471"}
            expect:
              said: [amoxicillin will be ready on Friday]
              requests: [{method: POST, path: /rx/4471, body: {store: leeds, who: "4471"}}]
          - name: not found here
            variables: {caller_number: "4471"}
            http: {/rx/4471: {status: 404, json: {error: no such prescription}}}
            expect:
              said: [could not find that prescription]
          - name: the body is checked
            variables: {caller_number: "4471"}
            expect:
              requests: [{path: /rx/4471, body: {store: york}}]
        """))
    r = subprocess.run([sys.executable, "-m", "callcenter.cli", "test", str(tmp_path / "test.yaml")],
                       capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ok ") and lines[1].startswith("ok "), r.stdout
    assert lines[2].startswith("FAIL") and "expected a request  /rx/4471 with {'store': 'york'}" in lines[3]
    assert '"store": "leeds"' in lines[3] and r.stdout.strip().endswith("2 passed, 1 failed")


MAIN = """\
name: main
start: hello
nodes:
  hello:
    type: say
    text: Welcome.
    next: verify
  verify:
    type: subflow
    flow: verify.yaml
    next: menu
  menu:
    type: hangup
    text: "Thanks {name}, you are verified."
"""

VERIFY = """\
name: verify
start: ask_name
nodes:
  ask_name:
    type: ask
    prompt: What is your name?
    slots:
      name: {type: text}
    next: done
    on_failure: failed
  done:
    type: return
    text: Thank you.
  failed:
    type: hangup
    text: Sorry, I could not verify you.
"""


def test_a_subflow_runs_and_returns(tmp_path):
    (tmp_path / "verify.yaml").write_text(VERIFY)
    flow = load_flow(write(tmp_path, MAIN))
    assert flow.sources == [tmp_path / "flow.yaml", tmp_path / "verify.yaml"]
    d = Dialog(flow)
    assert says(d.start()) == "Welcome. What is your name?"
    assert says(d.on_utterance("Dana")) == "Thank you. Thanks Dana, you are verified."
    assert d.path == ["hello", "verify", "verify/ask_name", "verify/done", "menu"]


def test_subflow_mistakes_are_located_in_their_own_file(tmp_path):
    (tmp_path / "verify.yaml").write_text(VERIFY.replace("next: done", "next: dnoe"))
    with pytest.raises(UserFileError) as exc:
        load_flow(write(tmp_path, MAIN))
    assert exc.value.problems == [f"{tmp_path / 'verify.yaml'}:9:5: unknown node 'dnoe' (did you mean 'done'?)"]
    ps = problems(tmp_path, MAIN.replace("verify.yaml", "missing.yaml"))
    assert ps == [f"{tmp_path / 'flow.yaml'}:10:5: missing.yaml: no such flow file"]
    (tmp_path / "verify.yaml").write_text(VERIFY.replace("    type: return\n", "    type: subflow\n    flow: flow.yaml\n"
                                                         "    next: failed\n").replace("    text: Thank you.\n", ""))
    ps = problems(tmp_path, MAIN)
    assert len(ps) == 1 and "sub-flows call each other in a loop (flow.yaml -> verify.yaml -> flow.yaml)" in ps[0]
    (tmp_path / "verify.yaml").write_text(VERIFY)
    ps = problems(tmp_path, MAIN.replace("    type: hangup\n", "    type: return\n"))
    assert any("return is only for a flow that another flow runs as a subflow" in p for p in ps)


def test_hot_reload_watches_the_subflow_files(tmp_path):
    import os
    import time

    from callcenter.dialog.library import FlowLibrary

    (tmp_path / "verify.yaml").write_text(VERIFY)
    library = FlowLibrary(write(tmp_path, MAIN))
    time.sleep(0.01)
    (tmp_path / "verify.yaml").write_text(VERIFY.replace("What is your name?", "Your full name, please?"))
    os.utime(tmp_path / "verify.yaml", ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert library.poll()
    assert library.current.nodes["verify/ask_name"].prompt == "Your full name, please?"
    (tmp_path / "verify.yaml").write_text(VERIFY.replace("next: done", "next: dnoe"))
    os.utime(tmp_path / "verify.yaml", ns=(time.time_ns() + 2 * 10**9, time.time_ns() + 2 * 10**9))
    assert not library.poll() and "dnoe" in library.errors[0]  # the running version stays


def test_one_run_shows_every_problem(tmp_path):
    ps = problems(tmp_path, """\
        name: e
        start: greet
        nodes:
          greet:
            type: say
            text: Hello
            next: question
          question:
            type: ask
            prompt: What?
          bye:
            type: hangup
            next: nowhere
          other:
            type: say
            text: hi
            next: byee
        """)
    where = str(tmp_path / "flow.yaml")
    assert ps == [f"{where}:8:3: nodes.question.on_failure: Field required",
                  f"{where}:8:3: nodes.question: an ask node needs intents or slots",
                  f"{where}:13:5: nodes.bye.next: 'next' is not a key here",
                  f"{where}:17:5: unknown node 'byee' (did you mean 'bye'?)"]
