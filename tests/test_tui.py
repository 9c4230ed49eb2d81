"""The supervisor console: Textual pilot tests pressing real keys against a real agent server with a
real SIP caller, snapshots of the main screens, and bursts of 50 calls."""

import asyncio
import re
import shutil
import time

import pytest

from callcenter.audio.wavfile import read_wav
from callcenter.supervisor.tui import CallsUpdated, EventArrived, Hello, Server, SupervisorApp

TOKEN = "tui-token-77"
TYPED = "Hello, this is the supervisor. I am taking over your call now."


# ------------------------------------------------------------------ recorded-looking data, no server
def call_events(call_id: str, start_wall: float = 1796250000.0) -> list[dict]:
    def e(kind, t, turn=0, **data):
        return {"kind": kind, "call_id": call_id, "t": t, "wall": start_wall + t, "turn": turn, **data}

    return [
        e("call_start", 0.0, flow="support", flow_version=1),
        e("agent_say", 0.01, text="Thank you for calling Example Telecom."),
        e("tts_first_audio", 0.02), e("first_rtp_out", 0.03),
        e("agent_say", 2.4, text="How can I help you today?"),
        e("speech_start", 5.0, 1), e("stt_partial", 5.9, 1, text="I have a question"),
        e("speech_end", 6.9, 1, last_voice_t=6.6), e("stt_final", 6.95, 1, text="I have a question about my bill"),
        e("flow_decision", 6.96, 1, node="main_menu", intent="billing", via="speech", next_node="billing_answer"),
        e("agent_say", 6.97, 1, text="For billing, your latest bill is in your online account."),
        e("tts_first_audio", 7.25, 1), e("first_rtp_out", 7.27, 1),
    ]


def row(call_id: str, n: int = 0, **over) -> dict:
    base = {"call_id": call_id, "caller": f"sip:+4415550{n:04d}@pbx.example", "flow": "support", "flow_version": 1,
            "node": "billing_answer", "state": "talking", "started": 1796250000.0 + n, "duration_s": 75.0 + n,
            "last_intent": "billing", "turn": 1, "levels": {"caller_db": -35.0, "agent_db": -18.0}, "marked": None}
    base.update(over)
    return base


def offline_app() -> SupervisorApp:
    import datetime as dt

    app = SupervisorApp([Server("http://127.0.0.1:9", "t")], connect=False, today=dt.date(2026, 12, 2))
    app.clock = lambda: 1796250000.0 + 8.0  # the recorded-looking calls' own time: no alert from the real clock
    return app


async def feed(app: SupervisorApp, pilot, calls: int = 3) -> None:
    ids = [f"call-{i:02d}" for i in range(calls)]
    app.post_message(Hello("http://127.0.0.1:9", {"calls": [], "history": {}}))
    for i, cid in enumerate(ids):
        for ev in call_events(cid):
            app.post_message(EventArrived("http://127.0.0.1:9", ev))
    app.post_message(CallsUpdated("http://127.0.0.1:9", [row(cid, i, state=("taken over" if i == 1 else "talking"))
                                                         for i, cid in enumerate(ids)]))
    await pilot.pause()


def test_bursts_collapse():
    a, b = CallsUpdated("s1", []), CallsUpdated("s1", [row("x")])
    assert a.can_replace(b) and not a.can_replace(CallsUpdated("s2", []))
    p1 = EventArrived("s", {"kind": "stt_partial", "call_id": "c", "text": "I"})
    p2 = EventArrived("s", {"kind": "stt_partial", "call_id": "c", "text": "I have"})
    final = EventArrived("s", {"kind": "stt_final", "call_id": "c", "text": "I have a bill"})
    assert p1.can_replace(p2) and not p1.can_replace(final) and not final.can_replace(p1)
    assert not p1.can_replace(EventArrived("s", {"kind": "stt_partial", "call_id": "other", "text": "x"}))


def test_main_screen_80x24(snap_compare):
    async def run_before(pilot):
        await feed(pilot.app, pilot)

    assert snap_compare(offline_app(), terminal_size=(80, 24), run_before=run_before)


def test_main_screen_120x36(snap_compare):
    async def run_before(pilot):
        await feed(pilot.app, pilot, calls=6)
        await pilot.press("down")

    assert snap_compare(offline_app(), terminal_size=(120, 36), run_before=run_before)


def test_take_over_prompt(snap_compare):
    async def run_before(pilot):
        await feed(pilot.app, pilot)
        await pilot.press("o")
        await pilot.press(*"Hello there")
        from textual.widgets import Input

        pilot.app.screen.query_one(Input).cursor_blink = False  # a blinking cursor makes the picture flaky
        await pilot.pause()

    assert snap_compare(offline_app(), terminal_size=(80, 24), run_before=run_before)


def test_fifty_busy_calls_stay_responsive():
    async def main():
        app = offline_app()
        async with app.run_test(size=(120, 40)) as pilot:
            ids = [f"call-{i:02d}" for i in range(50)]
            t0 = time.perf_counter()
            for second in range(10):  # ten seconds of a busy floor, posted at once
                for cid in ids:
                    for k in range(20):
                        app.post_message(EventArrived("http://127.0.0.1:9", {
                            "kind": "stt_partial", "call_id": cid, "t": second + k / 20, "wall": 0, "turn": 1,
                            "text": f"words {k}"}))
                    if second == 0:
                        for ev in call_events(cid):
                            app.post_message(EventArrived("http://127.0.0.1:9", ev))
                app.post_message(CallsUpdated("http://127.0.0.1:9", [row(cid, i) for i, cid in enumerate(ids)]))
            await pilot.pause()
            await pilot.press("down", "down", "down")
            await pilot.pause()
            elapsed = time.perf_counter() - t0
            table = app.query_one("#calls")
            assert table.row_count == 50 and table.cursor_row == 3
            assert app.selected == "http://127.0.0.1:9|call-03"
            return elapsed

    elapsed = asyncio.run(main())
    assert elapsed < 30  # 10,000+ messages handled; measured ~1-2 s here


# ------------------------------------------------------------------ against a live agent server
@pytest.mark.sip
@pytest.mark.slow
def test_pilot_takes_over_a_live_sip_call(tmp_path, stt):
    if not shutil.which("baresip"):
        pytest.skip("baresip is not installed")
    from callcenter.lab.agent_process import AgentProcess
    from callcenter.lab.softphone import Softphone, caller_audio
    from tests.conftest import FLOW, free_udp_port, rtp_base
    from tests.test_control_api import free_tcp_port

    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                         token=TOKEN).start()
    mic = caller_audio([], tmp_path / "mic.wav", lead_s=40, gap_s=0, tail_s=0)
    phone = Softphone(tmp_path / "phone", mic)

    async def wait_for(pilot, check, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await pilot.pause(0.1)
            if check():
                return True
        return False

    async def main():
        app = SupervisorApp([Server(agent.control_url, TOKEN)])
        async with app.run_test(size=(100, 30)) as pilot:
            assert await wait_for(pilot, lambda: app.floor.servers.get(agent.control_url) == "connected")
            await asyncio.to_thread(phone.dial, agent.uri)
            assert await asyncio.to_thread(phone.wait_established, 10)
            table = app.query_one("#calls")
            assert await wait_for(pilot, lambda: table.row_count == 1)
            assert await wait_for(pilot, lambda: any(
                "Thank you for calling" in t for _, t in app.floor.calls[app.selected].transcript()))
            await pilot.pause(1.0)
            await pilot.press("o")
            await pilot.press(*TYPED)
            await pilot.press("enter")
            view = app.floor.calls[app.selected]
            assert await wait_for(pilot, lambda: any(e["kind"] == "supervisor" and e.get("action") == "say"
                                                     for e in view.events))
            assert await wait_for(pilot, lambda: view.row.get("state") == "taken over")
            await pilot.pause(6.0)  # the typed sentence is spoken
            await pilot.press("m")
            await pilot.press(*"review this", "enter")
            assert await wait_for(pilot, lambda: view.row.get("marked") == "review this")
            await pilot.press("h", "y")  # hang up asks first
            assert await asyncio.to_thread(phone.wait_ended, 15)
            # the ended call stays a while, marked ended (and then leaves: see the offline test)
            assert await wait_for(pilot, lambda: view.ended and table.row_count == 1 and
                                  any(str(c).startswith("ended") for c in table.get_row(view.key)))
            said_at = next(e["t"] for e in view.events if e["kind"] == "supervisor" and e.get("action") == "say")
            await pilot.press("R")
            rec_table = app.screen.query_one("#recordings")
            assert await wait_for(pilot, lambda: rec_table.row_count == 1)
            await pilot.press("escape", "F")
            flows = app.screen.query_one("#flows")
            assert await wait_for(pilot, lambda: flows.row_count == 1)
            return said_at

    try:
        said_at = asyncio.run(main())
        phone.close()
        heard = read_wav(phone.received_wav())
        words = set(re.findall(r"[a-z]+", stt.transcribe_pcm(heard[int(said_at * 8000) * 2:
                                                                 int((said_at + 6) * 8000) * 2]).text.lower()))
        assert len(words & {"supervisor", "taking", "over", "call", "now", "hello"}) >= 3, words
    finally:
        phone.close()
        agent.stop()


def test_two_servers_share_one_table_and_the_palette_opens_screens():
    from tests.conftest import free_tcp_port

    # two servers that do not answer: loopback ports nobody listens on (never an outside address)
    urls = [f"http://127.0.0.1:{free_tcp_port()}", f"http://127.0.0.1:{free_tcp_port()}"]

    async def main():
        app = SupervisorApp([Server(u, "t") for u in urls], connect=False)
        async with app.run_test(size=(100, 30)) as pilot:
            for url in urls:
                for ev in call_events("same-id"):
                    app.post_message(EventArrived(url, ev))
                app.post_message(CallsUpdated(url, [row("same-id")]))
            await pilot.pause()
            assert app.query_one("#calls").row_count == 2  # same Call-ID on two workers: two calls
            await pilot.press("ctrl+p")
            await pilot.press(*"Flows")
            await pilot.press("enter")
            await pilot.pause(0.5)
            assert app.screen.__class__.__name__ == "FlowsScreen"
            assert app.screen.query_one("#flows").row_count == 2  # one row per server, both unreachable

    asyncio.run(main())


def test_calls_today_count_the_servers_recordings_once():
    import datetime as dt

    from callcenter.supervisor.floor import Floor

    floor = Floor(today=dt.date(2026, 12, 2))
    noon = dt.datetime(2026, 12, 2, 12).timestamp()
    floor.recorded("s", [{"call_id": "a", "started": noon}, {"call_id": "b", "started": noon - 86400},
                         {"call_id": "c", "started": None}])
    for ev in call_events("a", start_wall=noon):  # a call both recorded and seen live counts once
        floor.event("s", ev)
    assert floor.aggregates()["today"] == 1


# ------------------------------------------------------------------ the contact center's queues and agents
def queue_board() -> dict:
    return {
        "queues": [
            {"name": "billing", "waiting": 3, "longest_wait_s": 47.0, "available": 0, "busy": 2, "paused": 1,
             "answered_today": 41, "abandoned_today": 3, "timed_out_today": 1, "callbacks_today": 2, "callbacks_pending": 1,
             "service_level": 0.78, "service_level_s": 20},
            {"name": "technical", "waiting": 0, "longest_wait_s": 0.0, "available": 1, "busy": 1, "paused": 0,
             "answered_today": 17, "abandoned_today": 0, "timed_out_today": 0, "callbacks_today": 0,
             "service_level": 0.94, "service_level_s": 30},
        ],
        "agents": [
            {"name": "alice", "state": "on_call", "reason": "", "in_state_s": 312.0, "call_id": "sip-101500-a1b2c3"},
            {"name": "bob", "state": "wrap_up", "reason": "", "in_state_s": 4.0, "call_id": None},
            {"name": "carol", "state": "paused", "reason": "lunch", "in_state_s": 1260.0, "call_id": None},
            {"name": "dave", "state": "available", "reason": "", "in_state_s": 95.0, "call_id": None},
            {"name": "erin", "state": "logged_out", "reason": "", "in_state_s": 7200.0, "call_id": None},
        ],
    }


async def show_queues(pilot) -> None:
    from callcenter.supervisor.tui import QueuesUpdated

    await feed(pilot.app, pilot, calls=4)
    pilot.app.post_message(QueuesUpdated("http://127.0.0.1:9", {"type": "queues", **queue_board()}))
    await pilot.pause()
    await pilot.press("Q")
    await pilot.pause()


def test_queues_screen_120x36(snap_compare):
    async def run_before(pilot):
        await show_queues(pilot)
        await pilot.press("down", "down")

    assert snap_compare(offline_app(), terminal_size=(120, 36), run_before=run_before)


def test_queues_screen_140x42(snap_compare):
    assert snap_compare(offline_app(), terminal_size=(140, 42), run_before=show_queues)


def test_main_screen_140x42_columns_are_not_cut(snap_compare):
    async def run_before(pilot):
        await feed(pilot.app, pilot, calls=3)
        pilot.app.post_message(CallsUpdated("http://127.0.0.1:9", [
            row("call-00", 0, node="a_rather_long_node_name", last_intent="billing_dispute", state="transferring")]))
        await pilot.pause()

    assert snap_compare(offline_app(), terminal_size=(140, 42), run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (120, 36), (140, 42)])
def test_no_key_or_column_is_cut_at_any_width(size):
    """The footer shows whole keys only (the commonest first, help always), none past the edge;
    a cell that grows after its row was added widens its column."""
    from textual.widgets import DataTable
    from textual.widgets._footer import FooterKey

    async def run():
        app = offline_app()
        async with app.run_test(size=size) as pilot:
            await feed(app, pilot, calls=2)
            app.post_message(CallsUpdated("http://127.0.0.1:9", [
                row("call-00", 0, node="a_rather_long_node", last_intent="billing_dispute", state="transferring"),
                row("call-01", 1)]))
            await pilot.pause()
            keys = [k for k in app.screen.query(FooterKey) if "-command-palette" not in k.classes]
            palette = next(k for k in app.screen.query(FooterKey) if "-command-palette" in k.classes)
            assert {k.action for k in keys} >= {"say", "take_over", "help", "release", "pause", "hangup"}
            assert all(k.region.right <= palette.region.x for k in keys), [(k.action, k.region) for k in keys]
            assert ("transfer" in {k.action for k in keys}) == (size[0] >= 120)
            cells = [str(c) for c in app.query_one("#calls", DataTable).get_row("http://127.0.0.1:9|call-00")]
            assert "transferring" in cells
            if size[0] >= 140:
                assert "support/a_rather_long_node" in cells and "billing_dispute" in cells, cells
    asyncio.run(run())


def test_an_ended_call_stays_a_while_dimmed_and_takes_no_action():
    from textual.widgets import DataTable

    from callcenter.supervisor.floor import ENDED_SHOWN_S

    async def run():
        app = offline_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await feed(app, pilot, calls=2)
            end = {"kind": "call_end", "call_id": "call-00", "t": 9.0, "wall": 1796250000.0 + 9.0, "ended_by": "caller"}
            app.post_message(EventArrived("http://127.0.0.1:9", end))
            app.post_message(CallsUpdated("http://127.0.0.1:9", [row("call-01", 1)]))  # gone from the server's table
            await pilot.pause()
            table = app.query_one("#calls", DataTable)
            assert "http://127.0.0.1:9|call-00" in table.rows
            assert "ended" in [str(c) for c in table.get_row("http://127.0.0.1:9|call-00")]
            app.selected = "http://127.0.0.1:9|call-00"
            assert app._target() == (None, None)  # no action on an ended call
            app.clock = lambda: 1796250000.0 + 9.0 + ENDED_SHOWN_S + 1
            app.post_message(CallsUpdated("http://127.0.0.1:9", [row("call-01", 1)]))
            await pilot.pause()
            assert "http://127.0.0.1:9|call-00" not in table.rows and "http://127.0.0.1:9|call-01" in table.rows
    asyncio.run(run())


def test_pilot_pauses_an_agent_with_a_reason():
    """The queue screen's keys reach the agent API: `p`, a reason, Enter."""
    from callcenter.supervisor.tui import QueuesScreen

    sent = []

    class Recording(Server):
        async def post(self, path, body=None):
            sent.append((path, body))
            return {"ok": True}

    async def go():
        app = SupervisorApp([Recording("http://127.0.0.1:9", "t")], connect=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await show_queues(pilot)
            assert isinstance(app.screen, QueuesScreen)
            alerts = str(app.screen.query_one("#queue-alerts").render())
            assert "billing: 3 waiting" in alerts  # past its 20 s service level
            await pilot.press("down", "down", "down")  # dave, available
            await pilot.press("p")
            await pilot.press(*"training")
            await pilot.press("enter")
            await pilot.pause(0.2)
            await pilot.press("up")  # carol, paused
            await pilot.press("u")
            await pilot.pause(0.2)

    asyncio.run(go())
    assert sent == [("/api/agents/dave/pause", {"reason": "training"}), ("/api/agents/carol/resume", {})]


def test_alerts_for_calls_that_need_a_look():
    from callcenter.supervisor.floor import CallView, call_alerts

    t0 = 1796250000.0
    view = CallView("s", "c", row={"started": t0, "state": "listening"})

    def e(kind, t, **data):
        view.events.append({"kind": kind, "call_id": "c", "t": t, "wall": t0 + t, **data})

    e("agent_say", 0.0, text="How can I help?")
    assert call_alerts(view, t0 + 5) == []
    assert call_alerts(view, t0 + 25) == ["silent 25 s"]
    for i in range(3):
        e("speech_start", 2.0 + i)
        e("stt_final", 3.0 + i, text="I want to talk to a real person" if i != 1 else "operator please")
        e("flow_decision", 3.1 + i, via="no_match" if i < 2 else "speech", node="menu")
    assert call_alerts(view, t0 + 6) == ["2 no-match", "asked for a person 3×"]
    view.row["state"] = "queued"
    assert "silent" not in " ".join(call_alerts(view, t0 + 60))  # on hold is quiet by design


def test_the_main_screen_shows_alerts(snap_compare):
    async def run_before(pilot):
        await feed(pilot.app, pilot, calls=2)
        pilot.app.clock = lambda: 1796250000.0 + 40.0  # 33 s since anyone spoke on either call
        pilot.app.post_message(CallsUpdated("http://127.0.0.1:9", [row("call-00", 0), row("call-01", 1)]))
        await pilot.pause()

    assert snap_compare(offline_app(), terminal_size=(120, 36), run_before=run_before)


def test_pilot_transfer_offers_the_flows_queues_and_the_free_agents():
    from callcenter.supervisor.tui import PickTarget, QueuesUpdated

    sent = []

    class Recording(Server):
        async def get(self, path):
            assert path == "/api/flows"
            return {"flows": [{"name": "support", "queues": ["billing", "technical"]}]}

        async def post(self, path, body=None):
            sent.append((path, body))
            return {"ok": True}

    async def go():
        app = SupervisorApp([Recording("http://127.0.0.1:9", "t")], connect=False)
        app.clock = lambda: 1796250000.0 + 8.0
        async with app.run_test(size=(120, 36)) as pilot:
            await feed(app, pilot, calls=1)
            app.post_message(QueuesUpdated("http://127.0.0.1:9", {"type": "queues", **queue_board()}))
            await pilot.pause()
            await pilot.press("t")
            await pilot.pause(0.2)
            assert isinstance(app.screen, PickTarget)
            assert app.screen.choices == [("queue", "billing"), ("queue", "technical"), ("agent", "dave"), ("uri", "")]
            await pilot.press("down", "down", "enter")  # the third: dave, the one free agent
            await pilot.pause(0.2)

    asyncio.run(go())
    assert sent == [("/api/calls/call-00/transfer", {"agent": "dave"})]


def test_destructive_keys_ask_first_and_pause_toggles():
    """`h` once dropped a live caller at once and `q` quit at once: both ask now (n keeps the call
    and the console); `p` pauses and, on a paused call, resumes; `m` says it marked; `?` shows the
    keys."""
    from callcenter.supervisor.tui import Confirm, HelpScreen

    sent = []

    class Recording(Server):
        async def post(self, path, body=None):
            sent.append((path, body))
            return {"ok": True, "call": {}}

    async def go():
        app = SupervisorApp([Recording("http://127.0.0.1:9", "t")], connect=False)
        app.clock = lambda: 1796250000.0 + 8.0
        async with app.run_test(size=(120, 36)) as pilot:
            await feed(app, pilot, 2)
            await pilot.press("h")
            assert isinstance(app.screen, Confirm) and "goodbye" in str(app.screen.question)
            await pilot.press("n")
            await pilot.pause(0.1)
            assert sent == []
            await pilot.press("h", "y")
            await pilot.pause(0.2)
            assert sent[-1][0].endswith("/hangup")
            await pilot.press("down")  # call-01, "taken over"
            app.floor.calls[next(k for k in app.floor.calls if k.endswith("call-01"))].row["state"] = "paused"
            await pilot.press("p")
            await pilot.pause(0.2)
            assert sent[-1][0] == "/api/calls/call-01/resume"
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            await pilot.press("q")
            assert isinstance(app.screen, Confirm) and "Quit" in str(app.screen.question)
            await pilot.press("n")
            await pilot.pause(0.1)
            assert app.is_running

    asyncio.run(go())


def test_the_transcript_shows_what_the_flow_heard_and_a_keyed_number_on_one_line():
    from callcenter.supervisor.floor import transcript_lines

    def e(kind, **data):
        return {"kind": kind, "call_id": "c", "t": 0.0, "wall": 0.0, "turn": 1, **data}

    lines = transcript_lines([
        e("stt_final", text="my date of birth is the fourth of March 1985"),
        e("flow_decision", node="dob", intent=None, score=1.0, via="slots", next_node="acct", born="1985-03-04"),
        *[x for d in "4721" for x in (e("dtmf", digit=d, source="rfc4733"),
                                      e("flow_decision", node="acct", intent=None, score=0.0, via="keypad",
                                        next_node="acct"))],
        e("flow_decision", node="acct", intent=None, score=1.0, via="keypad", next_node="done", value="4721"),
    ])
    assert lines == [("caller", "my date of birth is the fourth of March 1985"),
                     ("flow", "dob → acct (slots, born: 1985-03-04)"), ("keypad", "4721"),
                     ("flow", "acct → done (keypad, value: 4721)")]


def campaign_summaries() -> list[dict]:
    counts = {"contacts": 20, "dialled": 13, "calls": 17, "answered": 9, "machine": 0, "no_answer": 2, "busy": 2,
              "failed": 0, "dnc_skipped": 2, "refused": 0, "remaining": 5}
    return [{"name": "december-reminders", "state": "running", "flow": "reminder", "file": "x", "created": 1.0,
             "updated": 2.0, "counts": counts},
            {"name": "survey", "state": "paused", "flow": "survey", "file": "y", "created": 0.5, "updated": 1.0,
             "counts": {**counts, "contacts": 3, "dialled": 0, "calls": 0, "answered": 0, "no_answer": 0, "busy": 0,
                        "dnc_skipped": 0, "remaining": 3}}]


async def show_campaigns(pilot) -> None:
    from callcenter.supervisor.campaigns_screen import CampaignsUpdated

    await pilot.press("C")
    await pilot.pause()
    pilot.app.screen.post_message(CampaignsUpdated(campaign_summaries()))
    await pilot.pause()


def test_the_campaigns_panel_counts_each_campaigns_calls():
    async def main():
        app = offline_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await show_campaigns(pilot)
            table = app.screen.query_one("#campaigns")
            assert app.screen.__class__.__name__ == "CampaignsScreen" and table.row_count == 2
            assert [str(c) for c in table.get_row("december-reminders")] == [
                "december-reminders", "running", "reminder", "20", "13", "9", "0", "2", "2", "0", "2", "5"]
            await pilot.press("escape")
            assert app.screen.__class__.__name__ != "CampaignsScreen"

    asyncio.run(main())


def test_campaigns_screen_120x36(snap_compare):
    assert snap_compare(offline_app(), terminal_size=(120, 36), run_before=show_campaigns)


def test_the_recordings_screen_shows_caller_and_outcome_and_a_voicemail_inbox():
    def rec(name: str, outcome: str, caller: str) -> tuple:
        return (f"http://127.0.0.1:9|2026-12-02|{name}", None,
                {"day": "2026-12-02", "name": name, "call_id": name, "flow": "after_hours", "started": 1796250000.0,
                 "duration_s": 42.0, "ended_by": "agent", "outcome": outcome, "caller": caller, "marked": None,
                 "wav": None})

    async def main():
        app = offline_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("R")
            await pilot.pause()
            screen = app.screen
            screen.show([rec("sip-1", "voicemail", "4155550100"), rec("sip-2", "ai_completed", "4155550101"),
                         rec("sip-3", "voicemail", "4155550102")])
            await pilot.pause()
            table = screen.query_one("#recordings")
            assert table.row_count == 3 and [str(c) for c in table.get_row_at(1)][1:5] == [
                "4155550101", "after_hours", "42 s", "ai_completed"]
            await pilot.press("v")
            await pilot.pause()
            assert table.row_count == 2 and table.border_title == "voicemail inbox"
            assert {str(table.get_row_at(i)[1]) for i in range(2)} == {"4155550100", "4155550102"}
            await pilot.press("v")
            await pilot.pause()
            assert table.row_count == 3

    asyncio.run(main())


def test_the_dead_letters_screen_lists_webhooks_that_never_got_through():
    from callcenter.supervisor.dead_letters_screen import DeadLettersUpdated

    letters = [{"call_id": "sip-101500-a1b2c3", "url": "https://crm.example.com/hooks/calls", "attempts": 5,
                "error": "HTTP 503", "failed": 1796250000.0},
               {"call_id": "out-101700-d4e5f6", "url": "https://crm.example.com/hooks/calls", "attempts": 5,
                "error": "Cannot connect to host crm.example.com:443", "failed": 1796249000.0}]

    async def main():
        app = offline_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("W")
            await pilot.pause()
            screen = app.screen
            table = screen.query_one("#dead-letters")
            assert table.row_count == 0
            screen.post_message(DeadLettersUpdated(letters))
            await pilot.pause()
            assert table.row_count == 2
            row = [str(c) for c in table.get_row_at(0)]
            assert row[1:] == ["sip-101500-a1b2c3", "https://crm.example.com/hooks/calls", "5", "HTTP 503"]
            assert "2 not delivered" in str(screen.query_one("#dead-letters-note").render())
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is not screen
    asyncio.run(main())
