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
