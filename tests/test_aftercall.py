"""After the call: the summary, categories and sentiment by rules over a call's events and row, and
the signed end-of-call webhook with its retries and dead letters (a loopback HTTP server)."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from callcenter.aftercall.summary import summarise
from callcenter.aftercall.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, DeadLetters, Webhook, signature
from callcenter.store.db import open_database
from callcenter.store.schema import migrate
from callcenter.store.url import StoreUrl

ROW = {"call_id": "sip-1", "direction": "inbound", "caller": "sip:4155550100@pbx", "caller_number": "4155550100",
       "flow": "support", "intent": "billing", "slots": {"account": "****1234"}, "nodes": ["welcome", "menu", "billing"],
       "outcome": "caller_hung_up", "started": 100.0, "ended": 160.0, "turns": 4}


def e(kind, t, **data):
    return {"kind": kind, "t": t, **data}


def test_a_call_in_trouble_is_said_so():
    events = [e("speech_start", 1.0), e("stt_final", 2.0, text="I want to talk to a person"),
              e("flow_decision", 2.1, via="no_match"), e("barge_in", 3.0), e("first_rtp_out", 3.1),
              e("playout_done", 4.0), e("speech_start", 14.0), e("stt_final", 15.0, text="an agent please!"),
              e("flow_decision", 15.1, via="no_match"), e("barge_in", 16.0)]
    found = summarise(ROW, events)
    assert found.categories == ["asked_for_a_person", "over_talk", "not_understood", "long_silence", "intent:billing"]
    assert found.sentiment == "negative"
    assert found.summary == ('Caller 4155550100 (support) about billing saying "I want to talk to a person". '
                             "Gave account ****1234. Went through 3 steps, last billing. Outcome: the caller hung up "
                             "before the end. 60 s, 4 turns.")


def test_a_call_handled_to_its_end_is_positive():
    row = {**ROW, "outcome": "ai_completed", "direction": "outbound", "slots": {}, "intent": None}
    found = summarise(row, [e("stt_final", 1.0, text="yes I can make it")])
    assert found.sentiment == "positive" and found.categories == []
    assert found.summary.startswith('We called 4155550100 (support) saying "yes I can make it".')


def test_the_webhook_is_signed_retried_and_dead_lettered(tmp_path):
    db = open_database(StoreUrl.parse(f"sqlite:///{tmp_path / 's.db'}", tmp_path))
    migrate(db)
    got: list[tuple[dict, str, str]] = []
    answers = [500, 503, 200]

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        got.append((json.loads(body), request.headers[SIGNATURE_HEADER], request.headers[TIMESTAMP_HEADER], body))
        return web.Response(status=answers.pop(0) if answers else 500)

    async def main():
        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"
        try:
            ok = await Webhook(url, "s3cret", 4, 0.01, DeadLetters(db)).send({"call_id": "sip-1", "outcome": "x"})
            assert ok and len(got) == 3
            answers.clear()  # from now on every try fails
            got.clear()
            ok = await Webhook(url, "s3cret", 2, 0.01, DeadLetters(db)).send({"call_id": "sip-2"})
            assert not ok and len(got) == 2
        finally:
            await runner.cleanup()

    asyncio.run(main())
    payload, sig, stamp, body = got[0]
    assert payload == {"call_id": "sip-2"} and sig == signature("s3cret", stamp, body)
    assert sig != signature("other", stamp, body)
    dead = DeadLetters(db).recent()
    assert [(d["call_id"], d["attempts"], d["error"]) for d in dead] == [("sip-2", 2, "HTTP 500")]


def test_a_webhook_nobody_listens_to_is_a_dead_letter_with_why(tmp_path):
    from tests.conftest import free_tcp_port

    db = open_database(StoreUrl.parse(f"sqlite:///{tmp_path / 's.db'}", tmp_path))
    migrate(db)
    url = f"http://127.0.0.1:{free_tcp_port()}/hook"
    assert not asyncio.run(Webhook(url, "k", 2, 0.01, DeadLetters(db)).send({"call_id": "sip-3"}))
    assert DeadLetters(db).recent()[0]["call_id"] == "sip-3"


AFTER_CALL_FLOW = """
name: support
variables: {plan: ""}
after_call:
  fields:
    reason: {description: why they called, from: last_intent}
    account: {description: their account number, type: number, from: account}
    follow_up_needed: {description: someone must call them, type: yes_no, when: "outcome != 'ai_completed'"}
    mentioned_router: {description: the router came up, type: yes_no, phrases: [router, modem]}
  categories:
    complaint: [unacceptable, "I want to complain", refund]
    billing: [my bill, invoice]
start: ask
nodes:
  ask:
    type: ask
    prompt: Your account number?
    slots: {account: {type: digits, min_length: 4, max_length: 8}}
    next: bye
    on_failure: bye
  bye: {type: hangup, text: Bye.}
"""


def test_a_flows_after_call_fields_and_phrase_categories_are_filled_by_rules(tmp_path):
    from callcenter.aftercall.fields import fill
    from callcenter.dialog.flow import load_flow

    path = tmp_path / "support.yaml"
    path.write_text(AFTER_CALL_FLOW)
    flow = load_flow(path)
    events = [{"kind": "stt_final", "text": "My Router keeps dropping, this is unacceptable."},
              {"kind": "stt_final", "text": "It's 4471."}]
    fields, categories = fill(flow.after_call, {"last_intent": "internet", "account": "4471"}, "transferred", events)
    assert fields == {"reason": "internet", "account": 4471, "follow_up_needed": True, "mentioned_router": True}
    assert categories == ["complaint"]  # "bill" is not "my bill"; "router" counts only as a whole word
    fields, categories = fill(flow.after_call, {}, "ai_completed", [{"kind": "stt_final", "text": "routers"}])
    assert fields == {"reason": None, "account": None, "follow_up_needed": False, "mentioned_router": False}


def test_after_call_mistakes_are_found_with_file_line_and_column(tmp_path):
    import pytest

    from callcenter.dialog.flow import load_flow
    from callcenter.yamlfile import UserFileError

    path = tmp_path / "support.yaml"
    for old, new, message in (("from: last_intent}", "from: last_intnet}", "unknown variable 'last_intnet'"),
                              ("phrases: [router, modem]}", "phrases: [router], from: plan}", "exactly one of"),
                              ("type: yes_no, when:", "when:", "type: yes_no")):
        path.write_text(AFTER_CALL_FLOW.replace(old, new))
        with pytest.raises(UserFileError) as err:
            load_flow(path)
        assert message in str(err.value) and "support.yaml:" in str(err.value), str(err.value)


def test_a_scorecard_scores_each_item_from_the_events_and_a_supervisor_overrides_one(tmp_path):
    from callcenter.aftercall.scorecard import load_scorecard, score
    from callcenter.dialog.flow import load_flow
    from callcenter.store.calls import CallRecords

    flow = load_flow("flows/support.yaml")
    card = load_scorecard("flows/scorecards/support.yaml", {flow.name: flow})
    events = [{"kind": "agent_say", "text": "Thank you for calling Example Telecom.", "t": 0.0},
              {"kind": "first_rtp_out", "t": 0.1}, {"kind": "playout_done", "t": 2.0},
              {"kind": "speech_start", "t": 12.5}, {"kind": "speech_end", "t": 13.4},  # 10.5 s of nothing
              {"kind": "flow_decision", "via": "no_match"}, {"kind": "flow_decision", "via": "no_match"},
              {"kind": "flow_decision", "via": "no_input"},
              {"kind": "agent_say", "text": "Goodbye.", "t": 20.0}]
    scores = score(card, events)
    got = {name: item["score"] for name, item in scores["items"].items()}
    assert got == {"greeted": "pass", "not_asked_to_repeat": "fail", "no_long_silence": "fail",
                   "offered_more_help": "fail"}
    assert scores["total"] == 0.25 and "asked again 3 time(s)" in scores["items"]["not_asked_to_repeat"]["why"]

    db = open_database(StoreUrl.parse(f"sqlite:///{tmp_path / 's.db'}", tmp_path))
    migrate(db)
    calls = CallRecords(db, "w1", "host")
    calls.started("c1", caller="sip:a@b", flow="support", flow_version=1)
    calls.scored("c1", scores)
    after = calls.override_score("c1", "no_long_silence", True, "the caller was reading their bill", "sup")
    assert after["total"] == 0.5 and calls.get("c1")["scores"]["items"]["no_long_silence"]["override"]["note"] \
        == "the caller was reading their bill"
    import pytest
    with pytest.raises(KeyError, match="greeting"):
        calls.override_score("c1", "greeting", True, "", "sup")


def test_a_scorecard_that_names_what_its_flow_lacks_is_refused_with_where(tmp_path):
    import pytest

    from callcenter.aftercall.scorecard import load_scorecard
    from callcenter.dialog.flow import load_flow
    from callcenter.yamlfile import UserFileError

    path = tmp_path / "card.yaml"
    path.write_text("flow: support\nitems:\n  verified:\n    description: x\n"
                    "    slot_before_node: {slot: account, node: billing_answr}\n")
    with pytest.raises(UserFileError) as err:
        load_scorecard(path, {"support": load_flow("flows/support.yaml")})
    assert "card.yaml:5:" in str(err.value) and "no slot 'account'" in str(err.value) and "billing_answr" in str(err.value)
    path.write_text("flow: support\nitems:\n  x: {description: y, max_reprompts: 1, max_silence_s: 3}\n")
    with pytest.raises(UserFileError, match="exactly one check"):
        load_scorecard(path)
