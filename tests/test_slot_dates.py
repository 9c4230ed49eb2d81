"""Date slots that keep the year: a date of birth said with its year is that date, a numeric date is
read in the order the flow's callers write it, and a date out of the slot's range is not taken."""

from __future__ import annotations

import datetime as dt

import pytest

from callcenter.dialog.slots import date_order_for, extract, parse_date

TODAY = dt.date(2026, 12, 7)


@pytest.mark.parametrize("said, order, born", [
    ("4 March 1985", "mdy", "1985-03-04"),
    ("the fourth of March nineteen eighty five", "mdy", "1985-03-04"),
    ("March 4th, 1985", "mdy", "1985-03-04"),
    ("04/03/1985", "dmy", "1985-03-04"),
    ("04/03/1985", "mdy", "1985-04-03"),
    ("4.3.85", "dmy", "1985-03-04"),
    ("1985-03-04", "dmy", "1985-03-04"),
    ("25/12/1960", "mdy", "1960-12-25"),  # 25 cannot be a month, whatever the order
    ("June the 5th two thousand and three", "dmy", "2003-06-05"),
    ("nineteen oh nine, January first", "dmy", "1909-01-01"),
])
def test_a_date_of_birth_keeps_its_year(said, order, born):
    assert parse_date(said, TODAY, "past", order=order) == born


def test_a_date_out_of_the_slots_range_is_not_taken():
    assert parse_date("4 March 1985", TODAY, "future") is None  # an appointment cannot be in 1985
    assert parse_date("4 March 1885", TODAY, "past") is None  # 141 years ago
    assert parse_date("4 March 2030", TODAY, "past") is None
    assert parse_date("4 March 2040", TODAY, "future") is None  # more than 5 years ahead
    assert parse_date("4 March 2040", TODAY, "future", years=20) == "2040-03-04"
    assert parse_date("1985", TODAY, "past") is None  # a year alone is not a date


def test_a_date_without_a_year_is_the_next_or_the_last_such_day():
    assert parse_date("March 3rd", TODAY, "future") == "2027-03-03"
    assert parse_date("March 3rd", TODAY, "past") == "2026-03-03"
    assert parse_date("December 24th", TODAY, "past") == "2025-12-24"
    assert parse_date("tomorrow at 10.30", TODAY) == "2026-12-08"  # 10.30 is a time, not a date
    assert parse_date("yesterday", TODAY, "past") == "2026-12-06"
    assert parse_date("tomorrow", TODAY, "past") is None


def test_the_order_of_numeric_dates_follows_the_flows_time_zone():
    assert date_order_for("Europe/Berlin") == "dmy" and date_order_for("Europe/London") == "dmy"
    assert date_order_for("America/New_York") == "mdy" and date_order_for("America/Indiana/Knox") == "mdy"
    assert date_order_for("America/Sao_Paulo") == "dmy" and date_order_for(None) == "mdy"


def test_a_flow_in_berlin_reads_04_03_as_the_4th_of_march(tmp_path):
    from callcenter.dialog.flow import load_flow

    path = tmp_path / "dentist.yaml"
    path.write_text("""
name: dentist
hours: {timezone: Europe/Berlin, open: {mon-fri: "08:00-18:00"}}
start: dob
nodes:
  dob:
    type: ask
    prompt: Your date of birth?
    on_failure: bye
    slots:
      born: {type: date, when: past}
    next: bye
  bye: {type: hangup, text: Goodbye.}
""")
    slot = load_flow(path).nodes["dob"].slots["born"]
    assert slot.order == "dmy"
    assert extract("date", "04/03/1985", TODAY, **slot.spec()) == "1985-03-04"
    assert extract("date", "4 March 1985", TODAY, **slot.spec()) == "1985-03-04"


def test_a_date_of_birth_is_read_back_and_the_caller_can_correct_it(tmp_path):
    """The read-back a date of birth needs: the value said as a date ("4 March 1985"), a no asks
    again, a corrected value is read back in turn, a yes goes on."""
    from callcenter.dialog.engine import Dialog, Say
    from callcenter.dialog.flow import load_flow

    path = tmp_path / "dob.yaml"
    path.write_text("""
name: dob
hours: {timezone: Europe/Berlin, open: {mon-sun: "00:00-23:59"}}
start: dob
nodes:
  dob:
    type: ask
    prompt: Please tell me your date of birth.
    on_failure: bye
    slots:
      born: {type: date, when: past, confirm: "I have {born|date}. Is that right?"}
    next: bye
  bye: {type: hangup, text: "Thank you, {born|date}."}
""")
    d = Dialog(load_flow(path), now=dt.datetime(2026, 12, 7, 10, 0), encoder=None)
    d.start()

    def said(actions):
        return " ".join(a.text for a in actions if isinstance(a, Say))

    assert said(d.on_utterance("the fourth of March nineteen eighty five")) == "I have 4 March 1985. Is that right?"
    assert said(d.on_utterance("no, the fifth of March nineteen eighty five")) == "I have 5 March 1985. Is that right?"
    assert said(d.on_utterance("hmm")).startswith("Please say yes or no.")
    assert said(d.on_utterance("no")) == "Sorry about that. Please tell me your date of birth."
    assert "born" not in d.variables or d.variables["born"] in (None, "")
    d.on_utterance("04/03/1985")
    assert said(d.on_utterance("yes that's right")) == "Thank you, 4 March 1985."
    assert d.variables["born"] == "1985-03-04" and d.path[-1] == "bye"
