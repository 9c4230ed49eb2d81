"""Slot values from what a caller said: digit strings, numbers, yes/no, dates, times, amounts of money
and free text. Rules, not models: the same words always give the same value, and a value that is
not there gives None (the flow then reprompts) rather than a guess."""

from __future__ import annotations

import calendar
import datetime as dt
import re

from callcenter.dialog.nlu import words
from callcenter.text.digits import digit_runs, spoken_digits

SLOT_TYPES = ("digits", "number", "yes_no", "date", "time", "currency", "text")

YES = {"yes", "yeah", "yep", "yup", "correct", "right", "sure", "absolutely", "affirmative", "ok", "okay",
       "true", "definitely", "indeed", "exactly", "certainly"}
NO = {"no", "nope", "nah", "wrong", "incorrect", "negative", "not", "false", "isn't", "isnt"}

_SMALL = {"zero": 0, "oh": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
          "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
          "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
          "a": 1, "an": 1}
_SCALE = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_ORDINAL = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
            "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13,
            "fourteenth": 14, "fifteenth": 15, "sixteenth": 16, "seventeenth": 17, "eighteenth": 18,
            "nineteenth": 19, "twentieth": 20, "thirtieth": 30}
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december"]
WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
WEEKDAY_KEYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
_TOKEN = re.compile(r"\d+(?:[.:/]\d+)*(?:st|nd|rd|th)?|[a-z]+(?:'[a-z]+)?|\$|&")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower().replace("-", " ").replace(",", " "))


# ------------------------------------------------------------------ numbers
def _ordinal_word(tok: str) -> int | None:
    if tok in _ORDINAL:
        return _ORDINAL[tok]
    for tens, value in (("twenty", 20), ("thirty", 30)):
        if tok.startswith(tens) and tok[len(tens):] in _ORDINAL:
            return value + _ORDINAL[tok[len(tens):]]
    m = re.fullmatch(r"(\d+)(st|nd|rd|th)", tok)
    return int(m.group(1)) if m else None


def numbers_in(text: str) -> list[tuple[float, int, int]]:
    """Every number in the text as (value, first token, token after), spoken or written:
    "twenty five", "one hundred and five", "3.5", "two point five"."""
    toks = _tokens(text)
    out: list[tuple[float, int, int]] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if re.fullmatch(r"\d+(\.\d+)?", tok):
            out.append((float(tok), i, i + 1))
            i += 1
            continue
        if tok in _SMALL and tok not in ("a", "an", "oh") or (tok in ("a", "an") and i + 1 < len(toks)
                                                               and toks[i + 1] in _SCALE):
            start, total, current = i, 0, 0
            while i < len(toks):
                t = toks[i]
                if t in _SMALL and not (t in ("a", "an") and current):
                    if current and _SMALL[t] >= 10 and current % 100 < 10 and current % 100 != 0:
                        break  # "five twenty": two numbers
                    if current % 100 >= 10 and (current % 10 == 0 or current % 100 < 20) and _SMALL[t] >= 10:
                        break  # "nineteen ninety", "twenty thirty": two numbers
                    current += _SMALL[t]
                elif t in _SCALE and (current or total):
                    scale = _SCALE[t]
                    if scale == 100:
                        current = max(current, 1) * 100
                    else:
                        total += max(current, 1) * scale
                        current = 0
                elif t == "and" and i + 1 < len(toks) and toks[i + 1] in _SMALL and toks[i + 1] not in ("a", "an") \
                        and (current >= 100 or total):
                    pass
                else:
                    break
                i += 1
            value = float(total + current)
            if i + 1 < len(toks) and toks[i] == "point" and toks[i + 1] in _SMALL:
                frac = ""
                i += 1
                while i < len(toks) and toks[i] in _SMALL and _SMALL[toks[i]] < 10:
                    frac += str(_SMALL[toks[i]])
                    i += 1
                value = float(f"{int(value)}.{frac or '0'}")
            out.append((value, start, i))
            continue
        i += 1
    return out


_WORD_NUMBERS = {"dozen": 12.0, "half": 0.5, "couple": 2.0, "quarter": 0.25}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def parse_number(text: str) -> float | None:
    """The first number said: "a hundred and twenty", "1,200", "two point five", "three and a half",
    "a dozen", "a couple", "half", "minus five"."""
    text = _THOUSANDS.sub("", text)
    toks = _tokens(text)
    found = numbers_in(text)
    if found:
        value, start, end = found[0]
        if toks[end:end + 1] == ["dozen"]:
            value *= 12
        elif toks[end:end + 3] == ["and", "a", "half"]:
            value += 0.5
        elif toks[end:end + 3] == ["and", "a", "quarter"]:
            value += 0.25
        if start and toks[start - 1] in ("minus", "negative"):
            value = -value
        words_first = next((i for i, t in enumerate(toks) if t in _WORD_NUMBERS), None)
        if words_first is None or words_first > start:
            return value
    for i, tok in enumerate(toks):
        if tok in _WORD_NUMBERS and (tok != "half" or not (i and toks[i - 1] in ("and",))):
            return _WORD_NUMBERS[tok]
    return None


# ------------------------------------------------------------------ yes / no
def parse_yes_no(text: str) -> bool | None:
    ws = set(words(text)) | set(_tokens(text))
    yes, no = bool(ws & YES), bool(ws & NO)
    if yes == no:
        return None
    return yes


# ------------------------------------------------------------------ digits
def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d * 2 > 9 else d * 2
        total += d
    return total % 10 == 0


def parse_digits(text: str, min_length: int = 1, max_length: int = 32, checksum: str | None = None) -> str | None:
    value = spoken_digits(text)
    if not value or not min_length <= len(value) <= max_length:
        runs = [r for r in digit_runs(text) if min_length <= len(r) <= max_length]
        if not runs:
            return None
        value = runs[-1]
    if checksum == "luhn" and not luhn_ok(value):
        return None
    return value


# ------------------------------------------------------------------ money
_MONEY_UNITS = ("dollar", "dollars", "bucks", "buck", "euro", "euros", "pound", "pounds", "quid", "grand")
_MONEY_WORDS = {"fiver": 5, "tenner": 10, "grand": 1000}  # "a tenner", "a grand"


def _amounts(toks: list[str], nums: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """Numbers with what follows them folded in: "two and a half thousand" (2500), "a couple of
    hundred" (200), "five grand" (5000)."""
    out = []
    for value, start, end in nums:
        if toks[end:end + 3] == ["and", "a", "half"] and toks[end + 3:end + 4] and toks[end + 3] in _SCALE:
            value, end = (value + 0.5) * _SCALE[toks[end + 3]], end + 4
        elif toks[end:end + 1] == ["grand"]:
            value *= 1000
        out.append((value, start, end))
    for i, tok in enumerate(toks):
        if tok in ("couple", "few") and toks[i + 1:i + 2] == ["of"] and toks[i + 2:i + 3] and toks[i + 2] in _SCALE:
            out.append(((2 if tok == "couple" else 3) * _SCALE[toks[i + 2]], i, i + 3))
        elif tok in _MONEY_WORDS and not (i and numbers_in(toks[i - 1])):
            out.append((float(_MONEY_WORDS[tok]), i, i + 1))
    return sorted(out, key=lambda n: n[1])


def parse_currency(text: str) -> str | None:
    """An amount of money as "25.50": "$25.50", "twenty five dollars and fifty cents", "25 bucks",
    "twelve pounds fifty", "nineteen ninety nine", "a tenner", "two and a half thousand dollars"."""
    text = _THOUSANDS.sub("", text)
    toks = _tokens(text)
    m = re.search(r"[$£€]\s*(\d+(?:\.\d{1,2})?)", text)
    if m:
        return f"{float(m.group(1)):.2f}"
    nums = _amounts(toks, numbers_in(text))
    if not nums:
        return None
    dollars = cents = None
    for k, (value, start, end) in enumerate(nums):
        unit = toks[end] if end < len(toks) else ""
        if (unit in _MONEY_UNITS or toks[end - 1] in _MONEY_WORDS) and dollars is None:
            dollars = value
            after = nums[k + 1] if k + 1 < len(nums) else None
            if after and after[1] == end + (unit in _MONEY_UNITS) and after[0] < 100 and \
                    toks[after[2]:after[2] + 1] not in (["cent"], ["cents"], ["pence"], ["p"]):
                cents = after[0]  # "twelve pounds fifty"
        elif unit in ("cent", "cents", "pence", "p") and cents is None:
            cents = value
    if dollars is None and cents is None:
        if len(nums) == 2 and ("and" in toks or nums[1][1] == nums[0][2] and nums[1][0] < 100):
            dollars, cents = nums[0][0], nums[1][0]  # "twenty and fifty", "one fifty", "nineteen ninety nine"
        else:
            dollars = nums[0][0]
    return f"{(dollars or 0) + (cents or 0) / 100:.2f}"


# ------------------------------------------------------------------ dates and times
# days callers name instead of dates: (words in order, month, day)
NAMED_DAYS = [(("christmas", "eve"), 12, 24), (("christmas",), 12, 25), (("xmas",), 12, 25), (("boxing", "day"), 12, 26),
              (("new", "year's", "eve"), 12, 31), (("new", "years", "eve"), 12, 31), (("new", "year's", "day"), 1, 1),
              (("new", "years", "day"), 1, 1), (("new", "year"), 1, 1), (("halloween",), 10, 31),
              (("valentine's",), 2, 14), (("valentines",), 2, 14), (("fourth", "of", "july"), 7, 4),
              (("independence", "day"), 7, 4)]
_COUNT = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
          "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "couple": 2, "few": 3}
_SPAN_DAYS = {"day": 1, "days": 1, "week": 7, "weeks": 7, "fortnight": 14, "fortnights": 14}


def _count_at(toks: list[str], i: int) -> int | None:
    tok = toks[i] if 0 <= i < len(toks) else ""
    return int(tok) if tok.isdigit() and int(tok) < 400 else _COUNT.get(tok)


def _next_on_or_after(today: dt.date, month: int, day: int) -> dt.date:
    for year in (today.year, today.year + 1):
        date = dt.date(year, month, day)
        if date >= today:
            return date
    return date


def _relative(toks: list[str], today: dt.date) -> dt.date | None:
    """"in two weeks", "in 3 days", "a week from tuesday", "two weeks from today", "a fortnight
    tomorrow", "the weekend", "christmas eve", "end of the month"."""
    for i, tok in enumerate(toks):
        if tok in _SPAN_DAYS:
            counted = _count_at(toks, i - 1) or (_count_at(toks, i - 2) if i >= 2 and toks[i - 1] == "of" else None)
            n = counted if counted is not None else (1 if tok in ("week", "fortnight", "day") else None)
            if n is None:
                continue
            span = dt.timedelta(days=n * _SPAN_DAYS[tok])
            rest = toks[i + 1:]
            joins = ("from", "after", "on") if counted is not None else ("from", "after")  # "next week on wed"
            if rest[:1] and rest[0] in joins and len(rest) > 1:  # "a week from tuesday", "two weeks on monday"
                base = _base_day(rest[1:], today)
                if base is not None:
                    return base + span
            if "in" in toks[max(0, i - 4):i] or rest[:1] == ["time"] or rest[:1] == ["today"]:
                return today + span  # "in two weeks", "two weeks' time"
            if rest[:1] == ["tomorrow"]:
                return today + dt.timedelta(days=1) + span
    for words_, month, day in NAMED_DAYS:
        n = len(words_)
        if any(tuple(toks[i:i + n]) == words_ for i in range(len(toks) - n + 1)):
            return _next_on_or_after(today, month, day)
    if "weekend" in toks:
        i = toks.index("weekend")
        later = 7 if toks[i + 1:i + 3] == ["after", "next"] else 0
        return today + dt.timedelta(days=((5 - today.weekday()) % 7 or (7 if today.weekday() == 5 else 0)) + later)
    if "end" in toks and "week" in toks:  # "the end of the week" (Friday), "end of next week"
        friday = today + dt.timedelta(days=(4 - today.weekday()) % 7)
        return friday + dt.timedelta(days=7 if "next" in toks else 0)
    if "end" in toks and "month" in toks:
        first_next = dt.date(today.year + today.month // 12, today.month % 12 + 1, 1)
        return first_next - dt.timedelta(days=1)
    return None


def _base_day(toks: list[str], today: dt.date) -> dt.date | None:
    if not toks:
        return None
    if toks[0] in ("today", "now"):
        return today
    if toks[0] == "tomorrow":
        return today + dt.timedelta(days=1)
    if toks[0] in WEEKDAYS:
        return today + dt.timedelta(days=(WEEKDAYS.index(toks[0]) - today.weekday()) % 7 or 7)
    return None


def _nth_weekday(toks: list[str], today: dt.date) -> dt.date | None:
    """"the first Monday of January", "the last Friday of the month", "the second Tuesday in next
    month": the next such day on or after today."""
    for i, tok in enumerate(toks[:-1]):
        nth = -1 if tok == "last" else _ORDINAL.get(tok)
        if nth is None or nth > 5 or toks[i + 1] not in WEEKDAYS or toks[i + 2:i + 3] not in (["of"], ["in"]):
            continue
        rest = toks[i + 3:i + 5]
        if rest[:1] and rest[0] in MONTHS:
            months = [(today.year, MONTHS.index(rest[0]) + 1), (today.year + 1, MONTHS.index(rest[0]) + 1)]
        elif rest[-1:] == ["month"] and rest[0] in ("the", "this"):
            months = [(today.year, today.month)]
        elif rest == ["next", "month"]:
            months = [(today.year + today.month // 12, today.month % 12 + 1)]
        else:
            continue
        for year, month in months:
            days = [dt.date(year, month, d) for d in range(1, calendar.monthrange(year, month)[1] + 1)
                    if dt.date(year, month, d).weekday() == WEEKDAYS.index(toks[i + 1])]
            if nth > len(days):
                continue
            day = days[nth - 1] if nth > 0 else days[-1]
            if day >= today:
                return day
    return None


DATE_WHEN = ("future", "past", "any")  # a date slot's kind: an appointment, a birth date, either
DATE_ORDERS = ("mdy", "dmy", "ymd")  # how a caller writes a numeric date: 04/03/1985
DATE_YEARS = {"future": 5, "past": 120, "any": 120}  # how far from today a date of each kind may lie
# time zones whose callers write the month first (04/03 is April 3rd); everyone else writes the day first
MONTH_FIRST_ZONES = ("America/New_York", "America/Chicago", "America/Denver", "America/Los_Angeles",
                     "America/Phoenix", "America/Anchorage", "America/Detroit", "America/Boise", "America/Juneau",
                     "America/Indiana/", "America/Kentucky/", "America/North_Dakota/", "America/Menominee",
                     "America/Adak", "America/Nome", "America/Sitka", "America/Yakutat", "America/Metlakatla",
                     "Pacific/Honolulu", "US/", "America/Puerto_Rico")
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_NUMERIC_DATE = re.compile(r"\b(\d{1,2})([/.\-])(\d{1,2})\2(\d{4}|\d{2})\b")  # with a year: 04/03/1985, 4.3.85
_SHORT_DATE = re.compile(r"\b(\d{1,2})/(\d{1,2})\b")  # without: 12/24 (a slash only; 10.30 is a time)


def date_order_for(timezone: str | None) -> str:
    """The order callers in `timezone` write numeric dates in: month first in the United States
    (and without a time zone, as before), else day first (Europe/Berlin: 04/03 is 4 March)."""
    if not timezone or timezone.startswith(MONTH_FIRST_ZONES):
        return "mdy"
    return "dmy"


def _spoken_year(toks: list[str]) -> tuple[int, set[int]] | None:
    """A year in the caller's words and the tokens it took: "1985", "nineteen eighty five",
    "nineteen oh five", "twenty twenty four", "two thousand and three"."""
    for i, tok in enumerate(toks):
        if re.fullmatch(r"1[89]\d\d|2[01]\d\d", tok):
            return int(tok), {i}
        if tok in ("nineteen", "twenty") and i + 1 < len(toks):
            century = 1900 if tok == "nineteen" else 2000
            nxt = toks[i + 1]
            if nxt == "oh" and i + 2 < len(toks) and toks[i + 2] in _SMALL and 0 < _SMALL[toks[i + 2]] < 10:
                return century + _SMALL[toks[i + 2]], {i, i + 1, i + 2}
            if nxt in _SMALL and 10 <= _SMALL[nxt] < 20:
                return century + _SMALL[nxt], {i, i + 1}
            if nxt in _SMALL and _SMALL[nxt] >= 20 and _SMALL[nxt] % 10 == 0:
                unit = _SMALL.get(toks[i + 2], 0) if i + 2 < len(toks) else 0
                used = {i, i + 1, i + 2} if 0 < unit < 10 else {i, i + 1}
                return century + _SMALL[nxt] + (unit if 0 < unit < 10 else 0), used
        if tok == "two" and toks[i + 1:i + 2] == ["thousand"]:
            rest = toks[i + 2:]
            skip = 1 if rest[:1] == ["and"] else 0
            found = numbers_in(" ".join(rest[skip:skip + 2]))
            if found and found[0][1] == 0 and found[0][0] < 100:
                return 2000 + int(found[0][0]), set(range(i, i + 2 + skip + found[0][2]))
            return 2000, {i, i + 1}
    return None


def _two_digit_year(yy: int, today: dt.date, when: str) -> int:
    """'85' → 1985; '27' → 2027 for a future date, 1927 for a past one that would else lie ahead."""
    year = today.year // 100 * 100 + yy
    if when == "past" and year > today.year:
        year -= 100
    return year


def _in_range(date: dt.date, today: dt.date, when: str, years: int | None) -> bool:
    span = dt.timedelta(days=365.25 * (years if years is not None else DATE_YEARS[when]))
    if when == "past":
        return today - span <= date <= today
    if when == "future":
        return today <= date <= today + span
    return today - span <= date <= today + span


def _yearless(month: int, day: int, today: dt.date, when: str) -> dt.date | None:
    """A day and month without a year: the next such day (future, any) or the last one (past)."""
    years = (today.year, today.year - 1) if when == "past" else (today.year, today.year + 1)
    for year in years:
        try:
            date = dt.date(year, month, day)
        except ValueError:
            return None
        if (date <= today) if when == "past" else (date >= today):
            return date
    return None


def parse_date(text: str, today: dt.date, when: str = "future", years: int | None = None,
               order: str = "mdy") -> str | None:
    """A date as YYYY-MM-DD: "today", "tomorrow", "monday", "next friday", "december third", "the 5th",
    "3rd of january", "12/24", "2027-01-05", "4 March 1985", "nineteen eighty five", "04/03/1985".
    `when`: future (an appointment: today or later), past (a birth date: today or earlier) or any;
    a date without a year is the next such day (the last one for past). `years`: how far from today
    it may lie (default DATE_YEARS); a date out of range is None, not a guess. `order`: how numeric
    dates are written (mdy, dmy, ymd)."""
    date = _parse_date(text, today, when, order)
    if date is None or not _in_range(date, today, when, years):
        return None
    return date.isoformat()


def _numeric_date(t: str, today: dt.date, when: str, order: str) -> dt.date | None | bool:
    """04/03/1985, 4.3.85, 1985-3-4, 12/24: the date, None for one that cannot be, False when the
    text has no numeric date."""
    m = _ISO_DATE.search(t)
    if m:
        year, month, day = int(m.group(1)), int(m.group(2)), int(m.group(3))
    else:
        m = _NUMERIC_DATE.search(t) or _SHORT_DATE.search(t)
        if not m:
            return False
        first, second = int(m.group(1)), int(m.group(3 if m.re is _NUMERIC_DATE else 2))
        if first > 12 >= second:
            day, month = first, second
        elif second > 12 >= first:
            month, day = first, second
        else:
            day, month = (first, second) if order == "dmy" else (second, first)
        if m.re is _SHORT_DATE:
            return _yearless(month, day, today, when)
        c = m.group(4)
        year = int(c) if len(c) == 4 else _two_digit_year(int(c), today, when)
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def _parse_date(text: str, today: dt.date, when: str, order: str) -> dt.date | None:
    t = text.lower()
    numeric = _numeric_date(t, today, when, order)
    if numeric is not False:
        return numeric
    toks = _tokens(t)
    spoken = _spoken_year(toks)
    if spoken is not None:  # "4 March 1985": the year's tokens are not a day
        year, used = spoken
        rest = [tok for i, tok in enumerate(toks) if i not in used]
        month, day = _month_and_day(rest, today)
        if month and day:
            try:
                return dt.date(year, month, day)
            except ValueError:
                return None
        if month is None and day is None:
            return None  # a bare year is not a date
    for i, tok in enumerate(toks[:-1]):  # "the day before Christmas Eve", "the day after my birthday's Friday"
        if tok == "day" and toks[i + 1] in ("before", "after") and toks[i + 2:i + 3] != ["tomorrow"] \
                and (base := _parse_date(" ".join(toks[i + 2:]), today, when, order)) is not None:
            return base + dt.timedelta(days=1 if toks[i + 1] == "after" else -1)
    nth = _nth_weekday(toks, today)
    if nth is not None:
        return nth
    for i, tok in enumerate(toks[:-1]):
        later = toks[i + 1:i + 3]
        if tok in WEEKDAYS or tok in ("tomorrow", "today"):
            weeks = 1 if later[:1] == ["week"] else 1 if later == ["after", "next"] else 0
            if weeks and not (i and toks[i - 1] in ("next", "this") and later[:1] == ["week"]):
                base = _base_day([tok], today)  # "Monday week", "tomorrow week", "the Tuesday after next"
                return base + dt.timedelta(days=7 * weeks)
    relative = _relative(toks, today)
    if relative is not None:
        return relative
    if "today" in toks:
        return today
    if "yesterday" in toks:
        return today - dt.timedelta(days=1)
    if "tomorrow" in toks:
        if "after" in toks and "day" in toks:
            return today + dt.timedelta(days=2)
        return today + dt.timedelta(days=1)
    next_week = any(toks[i:i + 2] == ["next", "week"] for i in range(len(toks)))
    for i, tok in enumerate(toks):
        if tok in WEEKDAYS:
            if next_week:  # "friday next week", "next week friday": that day of the coming Monday's week
                monday = today + dt.timedelta(days=7 - today.weekday())
                return monday + dt.timedelta(days=WEEKDAYS.index(tok))
            ahead = (WEEKDAYS.index(tok) - today.weekday()) % 7 or 7
            return today + dt.timedelta(days=ahead)
    month, day = _month_and_day(toks, today)
    if not month or not day:
        return None
    return _yearless(month, day, today, when)


def _month_and_day(toks: list[str], today: dt.date) -> tuple[int | None, int | None]:
    """A month named and a day beside it ("december third", "3rd of january"), or a day alone
    ("the 5th": this month's, or next month's once it is past)."""
    month = day = None
    for i, tok in enumerate(toks):
        if tok in MONTHS:
            month = MONTHS.index(tok) + 1
            for j in (i + 1, i + 2, i - 1, i - 2, i - 3):
                if 0 <= j < len(toks):
                    day = _day_at(toks, j)
                    if day:
                        break
            return month, day
    for i, tok in enumerate(toks):
        d = _ordinal_word(tok) or (_ordinal_word(toks[i] + toks[i + 1]) if i + 1 < len(toks)
                                   and toks[i] in ("twenty", "thirty") else None)
        if d and (i and toks[i - 1] == "the" or tok.endswith(("st", "nd", "rd", "th"))):
            return (today.month if d >= today.day else today.month % 12 + 1), d
    return None, None


def _day_at(toks: list[str], j: int) -> int | None:
    tok = toks[j]
    if tok in ("twenty", "thirty") and j + 1 < len(toks):
        second = _ordinal_word(toks[j + 1])
        if second and second < 10:
            return (20 if tok == "twenty" else 30) + second
    d = _ordinal_word(tok)
    if d is None and tok.isdigit():
        d = int(tok)
    return d if d and 1 <= d <= 31 else None


def parse_time(text: str) -> str | None:
    """A time of day as HH:MM: "3 pm", "half past two", "fifteen thirty", "10:45", "noon". An hour
    from 1 to 6 without am/pm is taken as afternoon (office hours)."""
    t = text.lower().replace("a.m.", "am").replace("p.m.", "pm")
    toks = _tokens(t)
    if "noon" in toks or "midday" in toks:
        return "12:00"
    if "midnight" in toks:
        return "00:00"
    hour = minute = None
    before = False  # "ten to five": minutes before the hour named
    m = re.search(r"\b(\d{1,2})[:.](\d{2})\b", t)
    nums = [] if m else numbers_in(t)
    to = next((i for i, tok in enumerate(toks) if tok == "to" and 0 < i < len(toks) - 1
               and (toks[i - 1] in ("quarter", "half") or any(e == i and v < 60 and toks[s - 1:s] not in
                                                                  (["from"], ["between"]) for v, s, e in nums))
               and any(s == i + 1 and v <= 12 for v, s, _ in nums)), None)
    half = next((i for i, tok in enumerate(toks) if tok == "half" and any(s == i + 1 and 1 <= v <= 12
                                                                          for v, s, _ in nums)), None)
    if m:
        hour, minute = int(m.group(1)), int(m.group(2))
    elif not nums:
        return None
    elif "past" in toks or to is not None:
        rel = 30 if "half" in toks else 15 if "quarter" in toks else int(nums[0][0])
        target = [v for v, s, e in nums if "past" in toks[:s] or "to" in toks[:s]]
        hour = int(target[0] if target else nums[-1][0])
        minute = rel
        before = to is not None and "past" not in toks
    elif half is not None:  # British "half four": half past four
        hour, minute = int(next(v for v, s, _ in nums if s == half + 1)), 30
    else:
        hour = int(nums[0][0])
        minute = int(nums[1][0]) if len(nums) > 1 and nums[1][1] == nums[0][2] and nums[1][0] < 60 else 0
        if hour >= 100 and minute == 0:  # "ten thirty" said as 1030
            hour, minute = divmod(hour, 100)
    pm = "pm" in toks or "afternoon" in toks or "evening" in toks or "tonight" in toks
    am = "am" in toks or "morning" in toks
    if hour is None or not 0 <= hour <= 23 or not 0 <= minute <= 59:
        return None
    if pm and hour < 12:
        hour += 12
    elif am and hour == 12:
        hour = 0
    elif not am and 1 <= hour <= 6:
        hour += 12
    if before:  # the hour named, then the minutes before it: "quarter to one" is 12:45
        hour, minute = (hour - 1) % 24, 60 - minute
    return f"{hour:02d}:{minute:02d}"


def extract(slot_type: str, text: str, today: dt.date | None = None, **spec) -> object | None:
    """The value of a slot of this type in the caller's words, or None."""
    today = today or dt.date.today()
    if slot_type == "digits":
        return parse_digits(text, spec.get("min_length", 1), spec.get("max_length", 32), spec.get("checksum"))
    if slot_type == "number":
        value = parse_number(text)
        if value is None:
            return None
        if (lo := spec.get("min")) is not None and value < lo or (hi := spec.get("max")) is not None and value > hi:
            return None
        return int(value) if value.is_integer() else value
    if slot_type == "yes_no":
        return parse_yes_no(text)
    if slot_type == "date":
        return parse_date(text, today, spec.get("when") or "future", spec.get("years"), spec.get("order") or "mdy")
    if slot_type == "time":
        return parse_time(text)
    if slot_type == "currency":
        return parse_currency(text)
    if slot_type == "text":
        return text.strip() or None
    raise ValueError(f"unknown slot type {slot_type!r}")
