"""`callcenter report` from a store of yesterday's calls: the figures against their definitions,
one CSV line per interval, and the HTML page opened in a real Chromium (its tiles, its plots)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from callcenter.cli import main
from callcenter.store.calls import CallEnd, CallRecords
from callcenter.store.db import open_database
from callcenter.store.schema import migrate
from callcenter.store.url import StoreUrl

CHROMIUM = "/usr/bin/chromium"


def yesterday_at(hour: int, minute: int = 0) -> float:
    day = dt.date.today() - dt.timedelta(days=1)
    return dt.datetime(day.year, day.month, day.day, hour, minute).astimezone().timestamp()


# (hour, direction, outcome, nodes, queue, queue_wait_s, transfer_to, length_s, v2v ms, intent)
CALLS = [
    (9, "inbound", "ai_completed", ["welcome", "menu", "billing", "bye"], None, None, None, 60, [340.0], "billing"),
    (9, "inbound", "ai_completed", ["welcome", "menu", "billing", "bye"], None, None, None, 40, [350.0], "billing"),
    (9, "inbound", "caller_hung_up", ["welcome", "menu"], None, None, None, 20, [420.0], None),
    (10, "inbound", "queue_answered", ["welcome", "menu", "agent"], "help", 12.0, "queue:help/alice", 300, [360.0],
     "person"),
    (10, "inbound", "queue_answered", ["welcome", "menu", "agent"], "help", 45.0, "queue:help/bob", 200, [340.0],
     "person"),
    (10, "inbound", "queue_abandoned", ["welcome", "menu", "agent"], "help", None, None, 90, [], "person"),
    (11, "inbound", "transferred", ["welcome", "menu", "sales"], None, None, "sip:sales@pbx", 30, [330.0], "sales"),
    (11, "outbound", "no_answer", [], None, None, None, 30, [], None),
]


@pytest.fixture
def config(tmp_path):
    db = open_database(StoreUrl.parse(f"sqlite:///{tmp_path / 'callcenter.db'}", tmp_path))
    migrate(db)
    now = [0.0]
    calls = CallRecords(db, "127.0.0.1:5062", "host", clock=lambda: now[0])
    for i, (hour, direction, outcome, nodes, queue, wait, to, length, v2v, intent) in enumerate(CALLS):
        now[0] = yesterday_at(hour, i)
        calls.started(f"c{i}", direction=direction, flow="" if direction == "outbound" else "support",
                      answered=outcome != "no_answer")
        now[0] += length
        calls.ended(f"c{i}", CallEnd(outcome=outcome, nodes=nodes, intent=intent, queue=queue, queue_wait_s=wait,
                                     transfer_to=to, voice_to_voice_ms=v2v))
        if outcome == "caller_hung_up":
            calls.summarised(f"c{i}", "x", ["asked_for_a_person", "intent:x"], "negative")
    with db.transaction():
        db.execute("INSERT INTO queues(name, members, skills, strategy, service_level_s) VALUES(?, ?, ?, ?, ?)",
                   ("help", "[]", "[]", "longest_idle", 30.0))
    cfg = tmp_path / "sip.yaml"
    cfg.write_text(f"store: sqlite:///{tmp_path / 'callcenter.db'}\n")
    return cfg


def report(config, tmp_path, fmt: str, interval: str = "1h") -> str:
    out = tmp_path / f"report.{fmt}"
    assert main(["report", "--config", str(config), "--from", "yesterday", "--to", "yesterday", "--interval", interval,
                 "--format", fmt, "--out", str(out)]) == 0
    return out.read_text()


def test_the_figures_are_what_the_docs_define(config, tmp_path):
    rep = json.loads(report(config, tmp_path, "json"))
    t = rep["totals"]
    assert (t["offered"], t["contained"], t["transferred"], t["abandoned"], t["dialled"]) == (7, 2, 3, 2, 1)
    assert t["handle_time_median_s"] == 60.0 and t["voice_to_voice_median_ms"] == 345.0
    assert len(rep["intervals"]) == 24 and [b["offered"] for b in rep["intervals"][9:12]] == [3, 3, 1]
    (help_q,) = rep["queues"]
    assert help_q["entered"] == 3 and help_q["answered"] == 2 and help_q["abandoned"] == 1
    assert help_q["speed_of_answer_mean_s"] == 28.5 and help_q["service_level_s"] == 30.0
    assert help_q["service_level_pct"] == 33.3  # 1 of the 3 that entered answered within 30 s
    assert [a["agent"] for a in rep["agents"]] == ["alice", "bob"]
    funnel = {n["node"]: n for n in rep["funnel"]["support"]}
    assert funnel["welcome"]["reached"] == 7 and funnel["menu"]["left_here"] == 1 and funnel["agent"]["left_here"] == 1
    assert rep["intents"][0] == ["person", 3] and rep["categories"] == [["asked_for_a_person", 1]]


def test_one_csv_line_per_interval(config, tmp_path):
    lines = report(config, tmp_path, "csv", "15m").splitlines()
    assert lines[0].startswith("start,offered,contained") and len(lines) == 1 + 96
    nine = [line for line in lines if " 09:00," in line]
    assert nine and nine[0].split(",")[1:5] == ["3", "2", "0", "1"]  # the three calls of 09:00-09:02


def test_a_bad_period_is_one_line(config, capsys):
    assert main(["report", "--config", str(config), "--from", "someday"]) == 2
    assert "say today, yesterday" in capsys.readouterr().err


@pytest.mark.skipif(not Path(CHROMIUM).exists() or not shutil.which("chromium"), reason="chromium is needed")
def test_the_html_report_in_chromium(config, tmp_path):
    from playwright.sync_api import sync_playwright

    path = tmp_path / "report.html"
    report(config, tmp_path, "html")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 900, "height": 1400})
            page.goto(path.as_uri())
            tiles = page.inner_text("#totals")
            assert "7\noffered" in tiles and "2\ncontained" in tiles and "3\ntransferred" in tiles
            assert page.locator("#calls-plot rect").count() >= 5  # stacked bars for 09:00, 10:00, 11:00
            assert page.locator("#v2v-plot circle").count() == 3
            assert "alice" in page.inner_text("#agents") and "33.3" in page.inner_text("#queues")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_search_finds_a_call_by_what_was_said_and_by_its_summary(config, tmp_path, capsys):
    db = open_database(StoreUrl.parse(f"sqlite:///{tmp_path / 'callcenter.db'}", tmp_path))
    events = tmp_path / "c6.jsonl"
    events.write_text("\n".join(json.dumps(e) for e in (
        {"kind": "call_start", "t": 0.0}, {"kind": "agent_say", "t": 0.1, "text": "How can I help?"},
        {"kind": "stt_final", "t": 3.0, "text": "My router keeps dropping the connection"})) + "\n")
    with db.transaction():
        db.execute("UPDATE calls SET events=? WHERE call_id='c6'", (str(events),))
        db.execute("UPDATE calls SET summary='Caller about a broken modem.' WHERE call_id='c0'")
    assert main(["calls", "search", "Router dropping", "--config", str(config), "--since", "3d",
                 "--json", str(tmp_path / "found.json")]) == 0
    out = capsys.readouterr()
    assert "c6  caller: My router keeps dropping the connection" in out.out and out.err.strip() == "1 calls"
    assert [c["call_id"] for c in json.loads((tmp_path / "found.json").read_text())["calls"]] == ["c6"]
    assert main(["calls", "search", "modem", "--config", str(config), "--since", "3d"]) == 0
    assert "c0" in capsys.readouterr().out
    assert main(["calls", "search", "router toaster", "--config", str(config), "--since", "3d"]) == 0
    assert capsys.readouterr().err.strip() == "0 calls"
    assert main(["calls", "search", "  ", "--config", str(config)]) == 2


def test_scorecard_pass_rates_count_a_supervisors_override_instead():
    from callcenter.reports.figures import scorecards

    def call(greeted: str, silence: str, override: str | None = None) -> dict:
        items = {"greeted": {"score": greeted}, "no_long_silence": {"score": silence}}
        if override:
            items["no_long_silence"]["override"] = {"score": override, "note": "reading their bill"}
        return {"flow": "support", "scores": {"card": "support", "items": items}}

    rows = [call("pass", "pass"), call("pass", "fail"), call("fail", "fail", override="pass"), call("pass", "n/a"),
            {"flow": "support", "scores": {}}]
    assert scorecards(rows) == [
        {"flow": "support", "item": "greeted", "calls": 4, "passed": 3, "pass_pct": 75.0, "overridden": 0},
        {"flow": "support", "item": "no_long_silence", "calls": 3, "passed": 2, "pass_pct": 66.7, "overridden": 1}]
