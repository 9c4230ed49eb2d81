"""How callers say dates, and what the date slot makes of them. Today is Wednesday 2 December 2026.
Every phrasing here must parse to its date; the set grows with what callers are heard to say."""

import datetime as dt

import pytest

from callcenter.dialog.slots import parse_date

TODAY = dt.date(2026, 12, 2)  # a Wednesday

PHRASINGS = [
    ("today please", "2026-12-02"),
    ("tomorrow", "2026-12-03"),
    ("the day after tomorrow", "2026-12-04"),
    ("friday", "2026-12-04"),
    ("on monday", "2026-12-07"),
    ("friday next week", "2026-12-11"),
    ("next week on wednesday", "2026-12-09"),
    ("in two weeks", "2026-12-16"),
    ("in 3 days", "2026-12-05"),
    ("in a week", "2026-12-09"),
    ("in a couple of weeks", "2026-12-16"),
    ("two weeks from today", "2026-12-16"),
    ("a week from tuesday", "2026-12-15"),
    ("two weeks on monday", "2026-12-21"),
    ("a fortnight tomorrow", "2026-12-17"),
    ("christmas eve", "2026-12-24"),
    ("on Christmas Eve if you can", "2026-12-24"),
    ("boxing day", "2026-12-26"),
    ("new year's eve", "2026-12-31"),
    ("new year's day", "2027-01-01"),
    ("this weekend", "2026-12-05"),
    ("by the end of the month", "2026-12-31"),
    ("december third", "2026-12-03"),
    ("the 5th", "2026-12-05"),
    ("3rd of january", "2027-01-03"),
    ("12/24", "2026-12-24"),
    ("2027-01-05", "2027-01-05"),
]


@pytest.mark.parametrize("said,date", PHRASINGS)
def test_caller_phrasings_of_dates(said, date):
    assert parse_date(said, TODAY) == date


def test_what_is_not_a_date_stays_empty():
    for said in ("sometime", "whenever suits", "I don't know", "next week"):
        assert parse_date(said, TODAY) is None, said


NUMBERS = [
    ("a hundred and twenty", 120), ("1,200", 1200), ("twelve hundred", 1200), ("two point five", 2.5),
    ("three and a half", 3.5), ("a dozen", 12), ("two dozen", 24), ("a couple", 2), ("half", 0.5),
    ("minus five", -5), ("forty-two", 42), ("about 2,500,000", 2_500_000), ("seventy five percent", 75),
]


@pytest.mark.parametrize("said,value", NUMBERS)
def test_caller_phrasings_of_numbers(said, value):
    from callcenter.dialog.slots import parse_number

    assert parse_number(said) == value


# Free phrasing the rules used to miss (bench nlu's SLOT_SET, measured against the offline model there),
# and others of the same kinds written separately, so the rules are not fitted to the bench's set.
FREE = [
    ("date", "the third Thursday of February", "2027-02-18"),
    ("date", "Friday week", "2026-12-11"),
    ("date", "today week", "2026-12-09"),
    ("date", "the Wednesday after next", "2026-12-16"),
    ("date", "the day after boxing day", "2026-12-27"),
    ("date", "the last Monday in next month", "2027-01-25"),
    ("date", "the weekend after next", "2026-12-12"),
    ("date", "end of next week", "2026-12-11"),
    ("time", "twenty to eight in the morning", "07:40"),
    ("time", "half seven in the evening", "19:30"),
    ("time", "quarter to three", "14:45"),
    ("time", "from ten to five", "10:00"),  # a range's start, not 16:50
    ("currency", "a fiver", "5.00"),
    ("currency", "three pounds twenty", "3.20"),
    ("currency", "two ninety nine", "2.99"),
    ("currency", "one and a half thousand euros", "1500.00"),
    ("currency", "five grand", "5000.00"),
    ("currency", "twenty five dollars and fifty cents", "25.50"),
]


@pytest.mark.parametrize("kind,said,value", FREE)
def test_free_phrasings_of_dates_times_and_amounts(kind, said, value):
    from callcenter.dialog.slots import extract

    assert str(extract(kind, said, TODAY)) == value


def test_the_bench_set_of_free_phrasings_parses():
    from callcenter.dialog.slots import extract
    from callcenter.lab.bench.dialog import SLOT_SET, SLOT_TODAY

    wrong = [(said, extract(kind, said, dt.date.fromisoformat(SLOT_TODAY)), want) for kind, said, want in SLOT_SET
             if str(extract(kind, said, dt.date.fromisoformat(SLOT_TODAY))) != want]
    assert not wrong
