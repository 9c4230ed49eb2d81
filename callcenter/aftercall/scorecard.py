"""Quality scorecards: a YAML file per flow (`flows/scorecards/`), each item scored automatically
from the call's events when it is over, pass, fail or n/a, into the call's row (`scores`). A
supervisor can override an item with a note (`callcenter calls score`); reports count the final
scores.

```yaml
flow: support
items:
  greeted:                        # the agent's first sentence greets and names us
    description: Greeted the caller and named the company
    agent_said: {phrases: [thanks for calling, welcome to], where: first}
  verified_first:                 # the account number was taken before account details were given
    description: Verified the caller before account details
    slot_before_node: {slot: account, node: billing_answer}
  no_long_silence:
    description: No silence over 8 seconds
    max_silence_s: 8
  not_asked_to_repeat:
    description: The caller was not asked to repeat 3 times
    max_reprompts: 2
  offered_more_help:
    description: Offered further help before the end
    agent_said: {phrases: [anything else], where: last}
```

Each item has exactly one check. `agent_said` reads the agent's sentences (`first`, `last` or
`any`); `slot_before_node` is n/a on a call that never reached the node; `max_reprompts` counts the
flow's no-match and no-input decisions. Only the agent's own words and the events' timing are read:
both are masked already."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from callcenter.aftercall.fields import _normal, said_any
from callcenter.aftercall.summary import longest_silence
from callcenter.call import events as ev
from callcenter.store.calls import score_total
from callcenter.yamlfile import UserFileError, load_model

PASS, FAIL, NA = "pass", "fail", "n/a"
REPROMPTS = ("no_match", "no_input")  # a flow_decision's `via` that asks the caller again


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AgentSaid(_Strict):
    phrases: list[str] = Field(min_length=1)
    where: Literal["first", "last", "any"] = "any"


class SlotBeforeNode(_Strict):
    slot: str
    node: str


class Item(_Strict):
    description: str
    agent_said: AgentSaid | None = None
    slot_before_node: SlotBeforeNode | None = None
    max_silence_s: float | None = Field(None, gt=0)
    max_reprompts: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_check(self) -> "Item":
        checks = [k for k in ("agent_said", "slot_before_node", "max_silence_s", "max_reprompts")
                  if getattr(self, k) is not None]
        if len(checks) != 1:
            raise ValueError("give exactly one check: agent_said, slot_before_node, max_silence_s or max_reprompts"
                             f" (got {', '.join(checks) or 'none'})")
        return self


class Scorecard(_Strict):
    flow: str = Field(description="the flow (by its name) whose calls this card scores")
    items: dict[str, Item] = Field(min_length=1)

    @field_validator("items")
    @classmethod
    def _names(cls, v: dict) -> dict:
        for name in v:
            if not name.replace("_", "").isalnum() or name[0].isdigit():
                raise ValueError(f"item {name!r}: letters, digits and _, not starting with a digit")
        return v


def load_scorecard(path: str | Path, flows: Mapping[str, Any] | None = None) -> Scorecard:
    """The card, checked against its flow where `flows` (by name) has it: the slots and nodes it
    names exist."""
    card, doc = load_model(path, Scorecard)
    flow = (flows or {}).get(card.flow)
    if flow is not None:
        problems = []
        slots = {n for node in flow.nodes.values() for n in (getattr(node, "slots", None) or {})}
        for name, item in card.items.items():
            if item.slot_before_node is not None:
                check = item.slot_before_node
                if check.slot not in slots:
                    problems.append(f"{doc.where(('items', name, 'slot_before_node', 'slot'))}: "
                                    f"flow {flow.name!r} has no slot {check.slot!r}")
                if check.node not in flow.nodes:
                    problems.append(f"{doc.where(('items', name, 'slot_before_node', 'node'))}: "
                                    f"flow {flow.name!r} has no node {check.node!r}")
        if problems:
            raise UserFileError(problems)
    return card


def score(card: Scorecard, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every item's score and why, and the call's total (passed ÷ applicable)."""
    said = [e.get("text", "") for e in events if e.get("kind") == ev.AGENT_SAY]
    decisions = [e for e in events if e.get("kind") == ev.FLOW_DECISION]
    items: dict[str, dict[str, Any]] = {}
    for name, item in card.items.items():
        if item.agent_said is not None:
            check = item.agent_said
            pool = said[:1] if check.where == "first" else said[-1:] if check.where == "last" else said
            ok = said_any(_normal(" ".join(pool)), check.phrases)
            result = (PASS if ok else FAIL, f"the agent's {check.where} sentence" +
                      ("" if check.where != "any" else "s") + (" said it" if ok else f" did not say any of "
                                                               f"{', '.join(check.phrases)}"))
        elif item.slot_before_node is not None:
            result = _slot_before_node(item.slot_before_node, decisions)
        elif item.max_silence_s is not None:
            longest = longest_silence(events)
            result = (PASS if longest <= item.max_silence_s else FAIL, f"longest silence {longest:.1f} s")
        else:
            asked = sum(1 for d in decisions if d.get("via") in REPROMPTS)
            result = (PASS if asked <= item.max_reprompts else FAIL, f"asked again {asked} time(s)")
        items[name] = {"score": result[0], "why": result[1], "description": item.description}
    return {"card": card.flow, "items": items, "total": score_total(items)}


def _slot_before_node(check: SlotBeforeNode, decisions: list[dict[str, Any]]) -> tuple[str, str]:
    filled_at = entered_at = None
    for i, d in enumerate(decisions):
        detail = {k.removeprefix("slot_"): v for k, v in d.items()}
        if filled_at is None and detail.get(check.slot) not in (None, ""):
            filled_at = i
        if entered_at is None and d.get("next_node") == check.node:
            entered_at = i
    if entered_at is None:
        return NA, f"the call never reached {check.node}"
    if filled_at is not None and filled_at <= entered_at:
        return PASS, f"{check.slot} was given before {check.node}"
    return FAIL, f"{check.node} was reached before {check.slot} was given"
