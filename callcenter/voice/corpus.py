"""Training sentences for a voice: what a contact-center agent says, plus general English prose.

Deterministic for a seed, offline: the prose comes from the English reference text that ships with
CPython (`pydoc_data`), filtered to plain sentences; the agent lines are generated from templates
with names, amounts, dates, times and account numbers, so the voice learns the numbers it will read.
"""

from __future__ import annotations

import random
import re

NAMES = ["Alex", "Maria", "James", "Priya", "Chen", "Fatima", "Oliver", "Sofia", "Liam", "Aisha", "Noah",
         "Emma", "Lucas", "Grace", "Mateo", "Hannah", "Kofi", "Isabel", "Ethan", "Yuki"]
THINGS = ["bill", "invoice", "order", "parcel", "appointment", "refund", "payment", "account", "router",
          "contract", "subscription", "booking", "delivery", "claim", "card", "password"]
DEPARTMENTS = ["billing", "technical support", "sales", "customer care", "the returns team", "an operator"]
TEMPLATES = [
    "Thank you for calling, my name is {name}. How can I help you today?",
    "I can help you with your {thing}. Could you give me your account number, please?",
    "Your account number is {digits}. Is that correct?",
    "The amount due on your {thing} is {amount}.",
    "Your next payment of {amount} is due on {date}.",
    "I have booked your appointment for {date} at {time}.",
    "Please hold while I transfer you to {dept}.",
    "I'm sorry, I didn't catch that. Could you say it again?",
    "For billing, press one. For technical support, press two. To speak to an operator, press zero.",
    "Your {thing} was shipped on {date} and should arrive by {time} tomorrow.",
    "I can see a refund of {amount} for your {thing}.",
    "Is there anything else I can help you with today?",
    "Thank you for your patience, {name}. Your {thing} is now sorted.",
    "Let me read that back to you: {digits}.",
    "Our offices are open from {time} to {time2}, Monday to Friday.",
    "Please say or enter your {n}-digit customer number.",
    "You have {count} messages waiting. The first was left on {date} at {time}.",
    "Your reference number is {digits}. Please keep it for your records.",
    "Did you say {amount}? Please answer yes or no.",
    "I'm transferring your call now. Goodbye, and have a lovely day.",
    "Your {thing} has been updated, and a confirmation will be sent to your email.",
    "We have {count} agents available, and the waiting time is about {count2} minutes.",
    "Can I take your date of birth, please? For example, {date}.",
    "Sorry {name}, that number doesn't match our records. Let's try once more.",
]


def _amount(rng: random.Random) -> str:
    symbol = rng.choice("$$$£€")
    if rng.random() < 0.5:
        return f"{symbol}{rng.randint(1, 999)}.{rng.randint(0, 99):02d}"
    return f"{symbol}{rng.randint(1, 4999)}"


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1995, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(1, 12)}:{rng.choice([0, 5, 15, 30, 45, 50]):02d} {rng.choice(['am', 'pm'])}"


def agent_lines(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        lines.append(rng.choice(TEMPLATES).format(
            name=rng.choice(NAMES), thing=rng.choice(THINGS), dept=rng.choice(DEPARTMENTS),
            digits="".join(str(rng.randint(0, 9)) for _ in range(rng.choice([4, 6, 8, 10]))),
            amount=_amount(rng), date=_date(rng), time=_time(rng), time2=_time(rng),
            n=rng.choice((4, 6, 8)), count=rng.randint(1, 12), count2=rng.randint(2, 30)))
    return lines


def prose_lines() -> list[str]:
    from pydoc_data import topics

    text = re.sub(r"\s+", " ", " ".join(topics.topics.values()))
    keep = []
    for s in re.split(r"(?<=[.!?])\s+", text):
        if (6 <= len(s.split()) <= 22 and re.fullmatch(r"[A-Za-z ,.'?!-]+", s) and s[0].isupper()
                and not re.search(r"[A-Z]{2,}|__|\w\.\w", s)):
            keep.append(s)
    return sorted(set(keep))


def training_sentences(agent: int = 500, seed: int = 0) -> list[str]:
    """The sentences a voice is trained on, shuffled deterministically."""
    lines = agent_lines(agent, seed) + prose_lines()
    random.Random(seed).shuffle(lines)
    return lines
