"""A campaign file (`flows/campaigns/*.yaml`) and its contact list, as typed models.

```yaml
name: december-reminders
flow: reminder                 # an outbound flow of the server config (outbound.flows)
contacts: reminders.csv        # number, timezone (IANA), then the flow's variables
do_not_call: do-not-call.txt   # one number a line; the store's list is always checked too
windows:                       # when a contact may be called, in their own local time
  - {days: [mon, tue, wed, thu, fri], from: "09:00", to: "20:00"}
holidays: [2026-12-25]
attempts: 3
retry_s: {no_answer: 3600, busy: 600, failed: 1800}
pace: {max_concurrent: 2, calls_per_second: 1}   # and agents_queue: desk, max_abandon_rate: 0.03
```

Errors name the file, line and column."""

from __future__ import annotations

import csv
import datetime as dt
import re
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from callcenter.text.phone import phone_number
from callcenter.yamlfile import UserFileError, load_model

Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WEEKDAYS: tuple[str, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
CAMPAIGN_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"
MAX_CONTACTS = 100_000
CONTACT_COLUMNS = ("number", "timezone")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Window(_Strict):
    days: list[Weekday] = Field(default_factory=lambda: list(WEEKDAYS[:5]), description="mon..sun")
    start: dt.time = Field(alias="from", description="local time, e.g. 09:00")
    end: dt.time = Field(alias="to", description="local time, e.g. 20:00 (not included)")

    @model_validator(mode="after")
    def _order(self) -> "Window":
        if self.end <= self.start:
            raise ValueError(f"the window ends ({self.end}) before it starts ({self.start})")
        return self

    def holds(self, local: dt.datetime) -> bool:
        return WEEKDAYS[local.weekday()] in self.days and self.start <= local.time() < self.end


class RetryDelays(_Strict):
    no_answer: float = Field(3600, ge=0, description="seconds before calling again after no answer")
    busy: float = Field(600, ge=0)
    failed: float = Field(1800, ge=0)


class Pace(_Strict):
    max_concurrent: int = Field(1, ge=1, le=64, description="this campaign's calls at once (and never more than "
                                                            "free call slots)")
    calls_per_second: float = Field(1.0, gt=0, le=50, description="new calls a second, at most")
    agents_queue: str | None = Field(None, description=(
        "the queue of human agents the flow hands answered people to: then no more calls at once than its free "
        "agents (less the callers already waiting for them), and the abandonment rate is kept under "
        "max_abandon_rate"))
    max_abandon_rate: float = Field(0.03, ge=0, le=1, description=(
        "people reached who then waited for an agent and left or timed out (queue_abandoned, queue_timeout), "
        "over all people reached: above this, one call at a time, only while an agent is free"))


class CampaignFile(_Strict):
    name: str = Field(pattern=CAMPAIGN_NAME)
    flow: str = Field(description="an outbound flow's name in the server config (outbound.flows)")
    contacts: Path = Field(description="CSV: number, timezone (IANA, e.g. America/New_York), then variables; "
                                       "relative to this file")
    do_not_call: Path | None = Field(None, description="numbers never called, one a line; relative to this file")
    windows: list[Window] = Field(min_length=1)
    holidays: list[dt.date] = Field(default_factory=list, description="no calls on these days, in the contact's time")
    attempts: int = Field(3, ge=1, le=20, description="calls to one contact at most")
    retry_s: RetryDelays = RetryDelays()
    pace: Pace = Pace()
    caller_id: str | None = Field(None, description="this campaign's caller ID (else outbound.caller_id)")

    @field_validator("holidays")
    @classmethod
    def _sorted(cls, v: list[dt.date]) -> list[dt.date]:
        return sorted(set(v))

    def settings(self) -> dict:
        """What the store keeps for every worker's dialer (the file may live on one machine only)."""
        return {"windows": [w.model_dump(mode="json", by_alias=True) for w in self.windows],
                "holidays": [d.isoformat() for d in self.holidays], "attempts": self.attempts,
                "retry_s": self.retry_s.model_dump(), "pace": self.pace.model_dump(), "caller_id": self.caller_id}


class Schedule:
    """When a contact may be called: the windows and holidays, in the contact's own time zone."""

    def __init__(self, settings: dict):
        self.windows = [Window.model_validate(w) for w in settings["windows"]]
        self.holidays = {dt.date.fromisoformat(d) for d in settings.get("holidays", [])}

    def open(self, zone: str, now: dt.datetime) -> bool:
        local = now.astimezone(ZoneInfo(zone))
        return local.date() not in self.holidays and any(w.holds(local) for w in self.windows)


def load_campaign(path: str | Path) -> tuple[CampaignFile, list[tuple[str, str, dict[str, str]]], list[str]]:
    """The campaign, its contacts (number, time zone, variables) and its do-not-call numbers."""
    path = Path(path)
    campaign, _ = load_model(path, CampaignFile)
    base = path.resolve().parent
    contacts = load_contacts(base / campaign.contacts)
    dnc = load_numbers(base / campaign.do_not_call) if campaign.do_not_call else []
    return campaign, contacts, dnc


def load_contacts(path: Path) -> list[tuple[str, str, dict[str, str]]]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserFileError([f"{path}: cannot read the contact list: {exc}"]) from None
    lines = text.splitlines()
    rows = list(csv.reader(lines))
    if not rows:
        raise UserFileError([f"{path}:1:1: the contact list is empty (its first line names the columns: "
                             "number,timezone,...)"])
    head = [h.strip() for h in rows[0]]
    problems = [f"{path}:1:1: the first columns must be number,timezone (then the flow's variables), got "
                f"{','.join(head[:2])}"] if tuple(head[:2]) != CONTACT_COLUMNS else []
    problems += [f"{path}:1:{_col(lines[0], i)}: column {h!r}: a variable name is letters, digits and _"
                 for i, h in enumerate(head[2:], 2) if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", h)]
    if problems:
        raise UserFileError(problems)
    out = []
    for n, row in enumerate(rows[1:], 2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(head):
            problems.append(f"{path}:{n}:1: {len(row)} fields, the header has {len(head)}")
            continue
        number = phone_number(row[0])
        zone = row[1].strip()
        if number is None:
            problems.append(f"{path}:{n}:{_col(lines[n - 1], 0)}: {row[0]!r} is not a phone number (+14155550100)")
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(f"{path}:{n}:{_col(lines[n - 1], 1)}: {zone!r} is not a time zone (e.g. Europe/Berlin)")
        out.append((number, zone, {h: cell.strip() for h, cell in zip(head[2:], row[2:])}))
        if len(out) > MAX_CONTACTS:
            problems.append(f"{path}:{n}:1: more than {MAX_CONTACTS} contacts: split the campaign")
            break
    if problems:
        raise UserFileError(problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else []))
    return out


def load_numbers(path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise UserFileError([f"{path}: cannot read the do-not-call list: {exc}"]) from None
    out, problems = [], []
    for n, line in enumerate(lines, 1):
        written = line.split("#", 1)[0].strip()
        if not written:
            continue
        number = phone_number(written)
        if number is None:
            problems.append(f"{path}:{n}:1: {line.strip()!r} is not a phone number")
        out.append(number)
    if problems:
        raise UserFileError(problems)
    return out


def _col(line: str, field: int) -> int:
    """The 1-based column where field number `field` starts in a plain CSV line."""
    return len(",".join(line.split(",")[:field])) + (2 if field else 1)
