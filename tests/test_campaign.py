"""Outbound campaigns with a fake line: the campaign file and its contacts, calling windows in each
contact's own time zone, the do-not-call list, retries on schedule, pacing, and a dialer that dies
mid-campaign and is replaced without any contact dialled twice for one attempt."""

from __future__ import annotations

import asyncio
import datetime as dt
import textwrap
import time

import pytest

from callcenter.campaign import dialer as dialer_mod
from callcenter.campaign.dialer import Dialer, campaign_clock
from callcenter.campaign.model import Schedule, load_campaign
from callcenter.store.campaigns import CampaignStore
from callcenter.store.db import open_database
from callcenter.store.schema import migrate
from callcenter.store.url import StoreUrl
from callcenter.yamlfile import UserFileError

MONDAY_1630_UTC = dt.datetime(2026, 12, 7, 16, 30, tzinfo=dt.timezone.utc)
ZONES = ("America/New_York", "Europe/Berlin", "Asia/Tokyo")  # 11:30 Monday, 17:30 Monday, 01:30 Tuesday
CAMPAIGN = """
name: december
flow: reminder
contacts: contacts.csv
do_not_call: dnc.txt
windows:
  - {days: [mon, tue, wed, thu, fri], from: "09:00", to: "20:00"}
holidays: [2026-12-25]
attempts: 2
retry_s: {no_answer: 0.3, busy: 0.3, failed: 0.3}
pace: {max_concurrent: 3, calls_per_second: 20}
"""


def write_campaign(tmp_path, rows: list[str], dnc: list[str] = ()) -> tuple:
    (tmp_path / "c.yaml").write_text(textwrap.dedent(CAMPAIGN))
    (tmp_path / "contacts.csv").write_text("number,timezone,name\n" + "\n".join(rows) + "\n")
    (tmp_path / "dnc.txt").write_text("# never call\n" + "\n".join(dnc) + "\n")
    return load_campaign(tmp_path / "c.yaml")


def store(tmp_path) -> CampaignStore:
    db = open_database(StoreUrl.parse(f"sqlite:///{tmp_path / 'store.db'}", tmp_path))
    migrate(db)
    return CampaignStore(db)


def test_bad_contacts_are_said_with_file_line_and_column(tmp_path):
    with pytest.raises(UserFileError) as err:
        write_campaign(tmp_path, ["+15550100,America/New_York,Dana", "5550101,Mars/Olympus,Sam", "hello,UTC,Al"])
    text = str(err.value)
    assert "contacts.csv:3:9: 'Mars/Olympus' is not a time zone" in text
    assert "contacts.csv:4:1: 'hello' is not a phone number" in text
    (tmp_path / "c.yaml").write_text(textwrap.dedent(CAMPAIGN).replace('to: "20:00"', 'to: "08:00"'))
    with pytest.raises(UserFileError, match="before it starts"):
        load_campaign(tmp_path / "c.yaml")


def test_calling_windows_are_each_contacts_own_local_time():
    schedule = Schedule({"windows": [{"days": ["mon", "tue", "wed", "thu", "fri"], "from": "09:00", "to": "20:00"}],
                         "holidays": ["2026-12-25"]})
    assert [schedule.open(z, MONDAY_1630_UTC) for z in ZONES] == [True, True, False]
    christmas = dt.datetime(2026, 12, 25, 16, 0, tzinfo=dt.timezone.utc)  # a Friday, 11:00 in New York
    assert not schedule.open("America/New_York", christmas)
    saturday = dt.datetime(2026, 12, 12, 16, 0, tzinfo=dt.timezone.utc)
    assert not schedule.open("Europe/Berlin", saturday)


def test_the_campaign_clock_can_be_moved_for_a_rehearsal(monkeypatch):
    monkeypatch.setenv("CALLCENTER_NOW", "2026-12-07T16:30:00+00:00")
    now = campaign_clock()()
    assert abs((now - MONDAY_1630_UTC).total_seconds()) < 5
    monkeypatch.setenv("CALLCENTER_NOW", "2026-12-07T16:30:00")
    with pytest.raises(ValueError, match="time zone"):
        campaign_clock()


class FakeCall:
    n = 0

    def __init__(self, outcome: str | None, after_s: float):
        FakeCall.n += 1
        self.call_id = f"out-{FakeCall.n}"
        self.outcome, self.progress = None, "ringing"
        self._end = (outcome, time.monotonic() + after_s)

    def poll(self) -> None:
        outcome, at = self._end
        if outcome is not None and time.monotonic() >= at:
            self.outcome, self.progress = outcome, "ended"


class FakeLine:
    """The server's `dial`: numbers ending in 1 are busy, in 2 never answered, in 9 ring for ever
    (until the dialer dies); the rest answered."""

    def __init__(self):
        self.dialled: list[str] = []
        self.calls: list[FakeCall] = []
        self.at_once = 0
        self.ring_for_ever = True

    async def dial(self, number, flow, variables, caller_id):
        assert flow == "reminder" and variables["name"]
        self.dialled.append(number)
        outcome = {"1": "busy", "2": "no_answer", "9": None if self.ring_for_ever else "ai_completed"}.get(
            number[-1], "ai_completed")
        call = FakeCall(outcome, 0.1)
        self.calls.append(call)
        live = sum(1 for c in self.calls if c.progress != "ended")
        self.at_once = max(self.at_once, live)
        return call

    def tick(self) -> None:
        for c in self.calls:
            c.poll()


async def run_until(dialer: Dialer, line: FakeLine, done, limit_s: float = 15.0) -> None:
    task = asyncio.create_task(dialer.run())
    deadline = time.monotonic() + limit_s
    try:
        while not done():
            assert time.monotonic() < deadline, "the campaign did not get there in time"
            line.tick()
            await asyncio.sleep(0.02)
    finally:
        task.cancel()


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(dialer_mod, "TICK_S", 0.02)
    monkeypatch.setattr(dialer_mod, "LEASE_S", 0.3)
    monkeypatch.setattr(dialer_mod, "UNFINISHED_GRACE_S", 0.3)


def test_twenty_contacts_in_three_time_zones(tmp_path, fast):
    rows = [f"+1555010{i:02d},{ZONES[i % 3]},Name{i}" for i in range(20)]
    dnc = ["+155501003", "+155501004"]  # row 4 is in New York, row 5 in Berlin
    campaign, contacts, numbers = write_campaign(tmp_path, rows, dnc)
    cs = store(tmp_path)
    cs.create(campaign.name, "c.yaml", campaign.flow, campaign.settings(), contacts, numbers)
    line = FakeLine()
    line.ring_for_ever = False
    dialer = Dialer(cs, line.dial, lambda: 4, "worker-a", lambda call_id: None, clock=lambda: MONDAY_1630_UTC)
    in_window = [c for c in contacts if c[1] != "Asia/Tokyo"]

    def settled():
        return sum(1 for c in cs.contacts("december", "done")) == len(in_window)

    asyncio.run(run_until(dialer, line, settled))
    by_number = {c.number: c for c in cs.contacts("december")}
    for number, zone, _ in contacts:
        c, times = by_number[number], line.dialled.count(number)
        if zone == "Asia/Tokyo":  # 01:30 there: never called, still pending
            assert times == 0 and c.state == "pending"
        elif number in dnc:
            assert times == 0 and c.result == "dnc_skipped"
        elif number[-1] in "12":  # retried once, on schedule, then final
            assert times == 2 and c.attempts == 2 and c.result == {"1": "busy", "2": "no_answer"}[number[-1]]
        else:
            assert times == 1 and c.result == "ai_completed"
    assert line.at_once <= 3  # pace.max_concurrent
    attempts = cs.attempts("december")
    assert len(attempts) == len(line.dialled) and all(r for *_, r in attempts)


def test_a_dialer_that_dies_is_replaced_and_no_attempt_is_made_twice(tmp_path, fast):
    rows = [f"+1555020{i:02d},Europe/Berlin,Name{i}" for i in (0, 9, 19, 29)]  # ending in 9: ring for ever
    campaign, contacts, numbers = write_campaign(tmp_path, rows)
    cs = store(tmp_path)
    cs.create(campaign.name, "c.yaml", campaign.flow, campaign.settings(), contacts, numbers)
    line = FakeLine()
    first = Dialer(cs, line.dial, lambda: 4, "worker-a", lambda call_id: None, clock=lambda: MONDAY_1630_UTC)
    # the first dialer places every call, then dies with three of them ringing (kill -9: nothing recorded)
    asyncio.run(run_until(first, line, lambda: len(line.dialled) == 4))
    assert sorted(c.state for c in cs.contacts("december")) == ["dialling"] * 3 + ["done"]
    ended_rows = {line.calls[1].call_id: {"ended": 1.0, "answered": 1.0, "outcome": "worker_lost"},
                  line.calls[2].call_id: {"ended": 1.0, "answered": None, "outcome": "worker_lost"}}
    # the second finds: one call answered before the death (final), one unanswered (tried again),
    # one with no row at all (counted as failed after the grace, tried again)
    second = Dialer(cs, line.dial, lambda: 4, "worker-b", ended_rows.get, clock=lambda: MONDAY_1630_UTC)
    line.ring_for_ever = False  # the redialled ones answer
    asyncio.run(run_until(second, line, lambda: not cs.contacts("december", "dialling")
                          and not cs.contacts("december", "pending")))
    results = {c.number: (c.attempts, c.result) for c in cs.contacts("december")}
    assert results["+155502000"] == (1, "ai_completed")
    assert results["+155502009"] == (1, "worker_lost")  # a person was reached: never called again
    assert results["+155502019"][0] == 2 and results["+155502029"][0] == 2
    assert [line.dialled.count(n) for n in ("+155502000", "+155502009", "+155502019", "+155502029")] == [1, 1, 2, 2]
    assert cs.campaign("december")["state"] == "finished"


def test_the_lease_lets_one_dialer_dial(tmp_path):
    cs = store(tmp_path)
    assert cs.take_lease("dialer", "a", 5) and not cs.take_lease("dialer", "b", 5) and cs.take_lease("dialer", "a", 5)


def test_campaign_commands_start_pause_resume_and_status(tmp_path, capsys):
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from callcenter.cli import main

    root = Path(__file__).resolve().parent.parent
    write_campaign(tmp_path, [f"+1555030{i:02d},Europe/Berlin,Name{i}" for i in range(3)], ["+155503001"])
    cfg = tmp_path / "sip.yaml"
    cfg.write_text(f"outbound:\n  flows: {{reminder: {root / 'flows/reminder.yaml'}}}\n  allow: ['+1555*']\n")

    def cli(*args):
        rc = main(["campaign", *args, "--config", str(cfg)])
        out = capsys.readouterr()
        return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)

    run = cli("start", str(tmp_path / "c.yaml"))
    assert run.returncode == 0 and "december: 3 contacts, running" in run.stdout, run.stderr
    again = cli("start", str(tmp_path / "c.yaml"))
    assert again.returncode == 2 and "exists already" in again.stderr
    assert cli("pause", "december").stdout.strip() == "december: paused"
    run = cli("status", "december", "--json", str(tmp_path / "s.json"))
    assert run.returncode == 0 and "december: paused, flow reminder" in run.stdout
    status = json.loads((tmp_path / "s.json").read_text())
    assert status["counts"]["remaining"] == 3 and status["counts"]["dialled"] == 0
    assert [c["state"] for c in status["contacts"]] == ["pending"] * 3
    assert cli("resume", "december").stdout.strip() == "december: running"
    assert cli("status", "nosuch").returncode == 2
    (tmp_path / "c.yaml").write_text(textwrap.dedent(CAMPAIGN).replace("flow: reminder", "flow: support"))
    run = cli("start", str(tmp_path / "c.yaml"))
    assert run.returncode == 2 and "'support' is not an outbound flow" in run.stderr
    (tmp_path / "c.yaml").write_text(textwrap.dedent(CAMPAIGN).replace("name: december", "name: other"))
    (tmp_path / "contacts.csv").write_text("number,timezone,nickname\n+15550400,UTC,D\n")
    run = cli("start", str(tmp_path / "c.yaml"))
    assert run.returncode == 2 and "contacts.csv:2: flow 'reminder' declares no variable 'nickname'" in run.stderr


def test_the_shipped_campaign_loads_and_fits_its_flow():
    from pathlib import Path

    from callcenter.dialog.flow import load_flow
    from callcenter.telephony.outbound import dial_variables

    root = Path(__file__).resolve().parent.parent
    campaign, contacts, dnc = load_campaign(root / "flows/campaigns/december-reminders.yaml")
    flow = load_flow(root / "flows" / f"{campaign.flow}.yaml")
    assert contacts and dnc and all(dial_variables(v, flow) == v for _, _, v in contacts)


def test_a_campaign_whose_flow_left_the_server_is_paused_not_burnt(tmp_path, fast):
    from callcenter.telephony.outbound import DialRefused

    campaign, contacts, numbers = write_campaign(tmp_path, ["+155507000,Europe/Berlin,A", "+155507001,Europe/Berlin,B"])
    cs = store(tmp_path)
    cs.create(campaign.name, "c.yaml", campaign.flow, campaign.settings(), contacts, numbers)

    async def no_such_flow(number, flow, variables, caller_id):
        raise DialRefused("no outbound flow 'reminder'", 404)

    dialer = Dialer(cs, no_such_flow, lambda: 4, "worker-a", lambda call_id: None, clock=lambda: MONDAY_1630_UTC)
    asyncio.run(run_until(dialer, FakeLine(), lambda: cs.campaign("december")["state"] == "paused"))
    assert [(c.state, c.attempts, c.result) for c in cs.contacts("december")] == [("pending", 0, None)] * 2


def test_calls_follow_the_free_agents_and_abandonment_over_the_bound_slows_to_one_at_a_time(tmp_path, fast):
    """The flow hands people to a queue of agents: never more calls at once than free agents; when
    people reached then leave the queue unanswered above the bound, one call at a time."""
    from callcenter.store.queues import QueueStore

    rows = [f"+1555030{i:02d},Europe/Berlin,Name{i}" for i in range(12)]
    (tmp_path / "c.yaml").write_text(textwrap.dedent(CAMPAIGN).replace(
        "pace: {max_concurrent: 3, calls_per_second: 20}",
        "pace: {max_concurrent: 3, calls_per_second: 20, agents_queue: desk, max_abandon_rate: 0.03}"))
    (tmp_path / "contacts.csv").write_text("number,timezone,name\n" + "\n".join(rows) + "\n")
    (tmp_path / "dnc.txt").write_text("")
    campaign, contacts, numbers = load_campaign(tmp_path / "c.yaml")
    cs = store(tmp_path)
    queues = QueueStore(cs.db, "w1")
    queues.define_agents([("alice", "sip:alice@127.0.0.1", (), True), ("bob", "sip:bob@127.0.0.1", (), True),
                          ("carol", "sip:carol@127.0.0.1", (), False)])
    queues.define_queue("desk", ["alice", "bob", "carol"], [], "longest_idle", 20)
    queues.heartbeat()
    cs.create(campaign.name, "c.yaml", campaign.flow, campaign.settings(), contacts, numbers)

    class Line(FakeLine):
        """The first two people reached give up waiting for an agent; the rest are answered."""
        def __init__(self):
            super().__init__()
            self.after_bound = 0  # calls at once once the rate went over the bound

        async def dial(self, number, flow, variables, caller_id):
            over = bool(dialer.over_bound.get("december"))
            call = FakeCall("queue_abandoned" if len(self.calls) < 2 else "queue_answered", 0.5)
            self.calls.append(call)
            live = sum(1 for c in self.calls if c.progress != "ended")
            self.at_once = max(self.at_once, live)
            if over:
                self.after_bound = max(self.after_bound, live)
            return call

    line = Line()
    dialer = Dialer(cs, line.dial, lambda: 4, "worker-a", lambda call_id: None, clock=lambda: MONDAY_1630_UTC)
    asyncio.run(run_until(dialer, line, lambda: sum(1 for _ in cs.contacts("december", "done")) == 12))
    assert line.at_once == 2, "two agents free (carol logged out): two calls at once, not max_concurrent's 3"
    assert dialer.over_bound["december"] and line.after_bound == 1
    counts = cs.summary("december")["counts"]
    assert counts["abandoned"] == 2 and counts["abandon_rate"] == round(2 / 12, 4)


def test_the_dialer_calls_back_a_queued_caller_retries_and_recovers_what_a_dead_dialer_left(tmp_path, fast):
    """Callbacks through the fleet's dialer with a fake line: dialled when an agent is free, tried
    again after no answer, done when answered; an attempt left `dialling` by a dead dialer takes
    its call's row."""
    from callcenter.campaign import callbacks as callbacks_mod
    from callcenter.campaign.callbacks import CallbackDialer
    from callcenter.errors import CallcenterError
    from callcenter.store.callbacks import DONE, CallbackStore
    from callcenter.store.queues import QueueStore

    cs = store(tmp_path)
    queues = QueueStore(cs.db, "w1")
    queues.define_agents([("alice", "sip:alice@127.0.0.1", (), True)])
    queues.define_queue("desk", ["alice"], [], "longest_idle", 20)
    queues.heartbeat()
    queues.join("c1", "desk")
    queues.leave("c1", "callback", ("+14155550199", "support", 3, 0.2))
    outcomes = ["no_answer", "queue_answered"]
    dialled = []

    class Full(CallcenterError):
        status = 503

    async def dial_callback(number, flow, queue):
        if not dialled and len(outcomes) == 2 and not getattr(dial_callback, "refused", False):
            dial_callback.refused = True
            raise Full("no free call slot")  # not an attempt: claimed back
        dialled.append((number, flow, queue))
        call = FakeCall(outcomes.pop(0), 0.05)
        line.calls.append(call)
        return call

    line = FakeLine()
    callbacks = CallbackStore(cs.db)
    dialer = Dialer(cs, line.dial, lambda: 4, "worker-a", lambda call_id: None, clock=lambda: MONDAY_1630_UTC,
                    callbacks=CallbackDialer(callbacks, dial_callback, lambda: 4, lambda call_id: None))
    asyncio.run(run_until(dialer, line, lambda: callbacks.get("c1").state == DONE))
    done = callbacks.get("c1")
    assert dialled == [("+14155550199", "support", "desk")] * 2
    assert done.attempts == 2 and done.result == "queue_answered"

    # a dialer that died with an attempt in flight: the next one reads the call's row
    queues.join("c2", "desk")
    queues.leave("c2", "callback", ("+14155550100", "support", 3, 0.2))
    [cb] = callbacks.due()
    callbacks.claim(cb)
    callbacks.placed(cb, "out-lost")
    rows = {"out-lost": {"ended": 1.0, "outcome": "busy"}}
    monkey = pytest.MonkeyPatch()
    monkey.setattr(callbacks_mod, "UNFINISHED_GRACE_S", 0.0)
    try:
        recovering = CallbackDialer(callbacks, dial_callback, lambda: 0, rows.get)
        asyncio.run(recovering.tick(holding=True))
    finally:
        monkey.undo()
    after = callbacks.get("c2")
    assert after.state == "waiting" and after.result == "busy" and after.attempts == 1
