"""The system of record at its interface, on both back ends (embedded SQLite and a real PostgreSQL
started by the tests): the `store:` setting, schema versions and `store check|migrate`, one row per
call with one outcome vocabulary, calls of dead workers, the old queues.db adopted, `calls list`."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time

import pytest

from callcenter.store.adopt import adopt_legacy_store
from callcenter.store.calls import OUTCOMES, WORKER_LOST, CallEnd, CallRecords
from callcenter.store.db import open_database
from callcenter.store.period import PeriodError, moment, period
from callcenter.store.queues import AgentState, QueueStore
from callcenter.store.schema import LATEST, MIGRATIONS, current_version, migrate, pending
from callcenter.store.url import StoreUrl, StoreUrlError
from callcenter.telephony.config import load_server_config
from tests.conftest import free_tcp_port

CLI = [sys.executable, "-m", "callcenter.cli"]


def test_the_store_setting(tmp_path):
    """One setting: a relative SQLite path is relative to the config file, the default lies beside
    it (outside recordings/), and a password in a URL is refused with a one-line error."""
    config = tmp_path / "etc" / "sip.yaml"
    config.parent.mkdir()
    config.write_text("recordings: ../rec\n")
    assert load_server_config(config).store_url().path == str(tmp_path / "etc" / "callcenter.db")
    config.write_text("store: sqlite:///data/cc.db\n")
    assert load_server_config(config).store_url().path == str(tmp_path / "etc" / "data" / "cc.db")
    config.write_text("store: postgresql://cc@db.example:5433/center?password_env=CC_DB_PASSWORD\n")
    url = load_server_config(config).store_url()
    assert (url.host, url.port, url.dbname, url.password_env) == ("db.example", 5433, "center", "CC_DB_PASSWORD")
    config.write_text("store: postgresql://cc:hunter2@db.example/center\n")
    with pytest.raises(Exception) as err:
        load_server_config(config)
    assert "a password in the URL is refused" in str(err.value) and "hunter2" not in str(err.value)
    with pytest.raises(StoreUrlError):
        StoreUrl.parse("mysql://x@h/d")


def test_a_fresh_store_is_migrated_to_the_latest_version(store_url):
    db = open_database(store_url)
    assert current_version(db) == 0 and len(pending(db)) == len(MIGRATIONS)
    assert [m.version for m in migrate(db)] == [m.version for m in MIGRATIONS]
    assert current_version(db) == LATEST and migrate(db) == []  # a second migrator finds the work done


def test_store_check_and_migrate_say_where_the_store_stands(tmp_path, store_url):
    config = tmp_path / "sip.yaml"
    config.write_text(f"store: '{store_url}'\n")
    db = open_database(store_url)
    with db.transaction():  # a store one version behind
        from callcenter.store.schema import VERSION_TABLE, _apply

        db.execute(VERSION_TABLE)
        _apply(db, MIGRATIONS[0])
        db.execute("INSERT INTO schema_version(version, name, applied) VALUES(1, 'queues and agents', 0)")
    check = subprocess.run([*CLI, "store", "check", "--config", str(config)], capture_output=True, text=True)
    assert check.returncode == 1 and "pending: 2" in check.stdout, check.stdout + check.stderr
    done = subprocess.run([*CLI, "store", "migrate", "--config", str(config)], capture_output=True, text=True)
    assert done.returncode == 0 and f"at version {LATEST}" in done.stdout
    check = subprocess.run([*CLI, "store", "check", "--config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0 and "current" in check.stdout


def test_an_unreachable_store_is_exit_2_and_one_line_naming_it(tmp_path):
    config = tmp_path / "sip.yaml"
    config.write_text(f"store: postgresql://cc@127.0.0.1:{free_tcp_port()}/center\n")
    check = subprocess.run([*CLI, "store", "check", "--config", str(config)], capture_output=True, text=True)
    assert check.returncode == 2
    line = check.stderr.strip().splitlines()[-1]
    assert line.startswith("callcenter: store postgresql://cc@127.0.0.1:") and "unreachable" in line


def test_one_row_per_call_with_its_outcome(store_url):
    db = open_database(store_url)
    migrate(db)
    rows = CallRecords(db, "10.0.0.5:5062", "host-a", clock=lambda: 1_000.0)
    rows.started("c1", caller="sip:+4930123@trunk", caller_number="+4930123", flow="dentist", flow_version=3,
                 recording="/rec/c1.wav", events="/rec/c1.jsonl")
    rows.started("c1", caller="again")  # a second start of the same call changes nothing
    rows.ended("c1", CallEnd("queue_answered", ["welcome", "reception"], intent="book",
                             slots={"born": "1985-03-04", "card": "************1111"}, transfer_to="queue:reception/ana",
                             queue="reception", queue_wait_s=12.5, voice_to_voice_ms=[300.0, 420.0, 360.0]))
    call = rows.get("c1")
    assert call["caller"] == "sip:+4930123@trunk" and call["host"] == "host-a" and call["flow_version"] == 3
    assert call["outcome"] == "queue_answered" and call["nodes"] == ["welcome", "reception"]
    assert call["slots"]["card"] == "************1111" and call["queue_wait_s"] == 12.5
    assert (call["turns"], call["voice_to_voice_p50_ms"], call["voice_to_voice_max_ms"]) == (3, 360.0, 420.0)
    with pytest.raises(ValueError):
        rows.ended("c1", CallEnd("resolved", []))  # not a word of the vocabulary
    assert {"ai_completed", "queue_abandoned", "worker_lost", "machine", "dnc_skipped"} <= set(OUTCOMES)


def test_the_calls_of_a_dead_worker_end_as_worker_lost(store_url):
    clock = [1_000.0]
    a = QueueStore(store_url, "a:5062", clock=lambda: clock[0], host="host-a")
    b = QueueStore(store_url, "b:5062", clock=lambda: clock[0], host="host-b")
    a.heartbeat()
    b.heartbeat()
    a.calls.started("on-a")
    b.calls.started("on-b")
    clock[0] += 60  # a stops beating
    b.heartbeat()
    assert a.calls.get("on-a")["outcome"] == WORKER_LOST and b.calls.get("on-b")["outcome"] is None


def test_an_old_queue_store_is_adopted_with_nothing_lost(tmp_path, store_url):
    rec = tmp_path / "recordings"
    old = QueueStore(rec / "queues.db", "w1")
    old.define_agents([("ana", "sip:ana@pbx", ("billing",), True), ("ben", "sip:ben@pbx", (), True)])
    old.set_agent_state("ben", "pause", "training")
    old.define_queue("reception", ["ana", "ben"], [], "longest_idle", 20)
    old.join("c1", "reception")
    old.leave("c1", "abandoned")
    old.close()
    db = open_database(store_url)
    migrate(db)
    assert adopt_legacy_store(db, rec) >= 4
    assert not (rec / "queues.db").exists() and (rec / "queues.db.adopted").exists()
    assert adopt_legacy_store(db, rec) == 0  # once
    new = QueueStore(db, "w2")
    assert new.agent("ben").state == AgentState.PAUSED and new.agent("ben").reason == "training"
    queues, _ = new.snapshot()
    assert queues[0].name == "reception"
    assert db.execute("SELECT kind FROM queue_log WHERE call_id='c1' ORDER BY t") == [("join",), ("abandoned",)]


def test_periods_as_operators_say_them():
    now = dt.datetime(2026, 12, 7, 15, 30, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert moment("today", now) == now.replace(hour=0, minute=0)
    assert moment("yesterday", now) == dt.datetime(2026, 12, 6, tzinfo=now.tzinfo)
    assert moment("7d", now) == now - dt.timedelta(days=7) and moment("24h", now) == now - dt.timedelta(hours=24)
    assert moment("2026-12-01", now) == dt.datetime(2026, 12, 1, tzinfo=now.tzinfo)
    assert moment("2026-12-01T09:30", now) == dt.datetime(2026, 12, 1, 9, 30, tzinfo=now.tzinfo)
    since, until = period("yesterday", "today", now)
    assert until - since == 86400
    with pytest.raises(PeriodError):
        moment("last tuesday", now)
    with pytest.raises(PeriodError):
        period("today", "yesterday", now)


def test_calls_list_reads_yesterdays_calls_from_the_store(tmp_path, store_url):
    config = tmp_path / "sip.yaml"
    config.write_text(f"store: '{store_url}'\n")
    db = open_database(store_url)
    migrate(db)
    now = time.time()
    midnight = dt.datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    for call_id, started, outcome in (("old", midnight - 3 * 86400, "ai_completed"),
                                      ("y1", midnight - 86400 + 60, "queue_abandoned"),
                                      ("y2", midnight - 3600, "voicemail"), ("t1", min(now, midnight + 60), None)):
        rows = CallRecords(db, "w:5062", "host-a", clock=lambda s=started: s)
        rows.started(call_id, caller_number="+4930123", flow="dentist")
        if outcome:
            rows.ended(call_id, CallEnd(outcome, ["welcome"]))
    out = tmp_path / "calls.json"
    listed = subprocess.run([*CLI, "calls", "list", "--config", str(config), "--since", "yesterday", "--until", "today",
                             "--json", str(out)], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert [c["call_id"] for c in json.loads(out.read_text())["calls"]] == ["y1", "y2"]
    lines = listed.stdout.strip().splitlines()
    assert len(lines) == 2 and "queue_abandoned" in lines[0] and "+4930123" in lines[0] and "voicemail" in lines[1]
