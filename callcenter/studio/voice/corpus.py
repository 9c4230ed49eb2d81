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


# What a contact-center agent also says, beyond its prompts: short answers and acknowledgements,
# questions back, what the caller said read back in the first person, sympathy, next steps. The
# prompt templates above are 24 sentences; a voice that learnt only from them (and prose) stumbled
# on short replies ("Yes." came out stretched, with a click at its end) and on first-person lines.
SHORT_REPLIES = [
    "Yes.", "No.", "Okay.", "Sure.", "Of course.", "Certainly.", "Right.", "Great.", "Perfect.", "Thank you.",
    "Thanks.", "Sorry?", "Pardon?", "Got it.", "I see.", "Understood.", "Absolutely.", "Not a problem.",
    "One moment.", "Just a second.", "Goodbye.", "Hello?", "Hi there.", "All done.", "That's right.",
    "No, not yet.", "Yes, please.", "No, thank you.", "Mm-hm.", "Alright.", "Good morning.", "Good afternoon.",
    "Good evening.", "You're welcome.", "Bye now.", "Welcome back.", "Exactly.", "Sounds good.", "Done.",
]
SUBJECTS = ["My {thing}", "The {thing}", "Your {thing}", "Our {thing}", "This {thing}", "That {thing}"]
STATES = ["is not working", "has been down since {day}", "keeps cutting out", "was charged twice",
          "never arrived", "is ready", "was cancelled by mistake", "looks fine on our side", "needs a reset",
          "is still pending", "has been sent", "will be replaced", "was delivered to the wrong address",
          "expires next month", "is blocked", "has a problem", "shows a red light", "is too expensive"]
OPENERS = ["I understand.", "I'm sorry to hear that.", "Let me check that for you.", "Thanks for waiting.",
           "I can see the problem.", "Bear with me.", "Okay, no problem.", "Right, let me look.",
           "That must be frustrating.", "Good news.", "I've found it.", "Let me explain."]
ASKS = ["Could you tell me your {field}?", "What is your {field}, please?", "Can you confirm your {field}?",
        "Would you like me to {action}?", "Shall I {action}?", "Do you want to {action} now?",
        "Is the {thing} in your name?", "When did you first notice it?", "Which {thing} is it about?",
        "Have you tried turning it off and on again?", "Are you still there?", "Is this a good time to talk?",
        "How would you like to pay?", "Can I help with anything else?", "Where should we send it?"]
FIELDS = ["full name", "postcode", "zip code", "date of birth", "email address", "phone number",
          "account number", "order number", "home address", "security answer", "card number", "surname"]
ACTIONS = ["book an engineer", "send a new one", "cancel it", "transfer you", "call you back later",
           "email the details", "open a complaint", "reset your password", "update your address",
           "waive the fee", "upgrade your plan", "check the line", "raise a ticket", "spell that back"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "yesterday", "last week",
        "this morning", "the weekend"]
READ_BACKS = ["You said {said}.", "So your {field} is {digits}.", "I heard {said}, is that right?",
              "Just to confirm, {said}.", "Thanks, {name}. {said_cap}."]
SAIDS = ["your {thing} {state}", "you want to {action}", "you moved house last month",
         "you were charged {amount}", "you called on {day}", "the engineer never came",
         "you'd like to speak to a manager", "you can't log in", "the bill went up to {amount}"]
NEXT = ["An engineer will visit on {date} between {time} and {time2}.", "You'll get a text when it's on its way.",
        "I've added a note to your account.", "That will take three to five working days.",
        "I'll put you through to {dept} now.", "The refund of {amount} is on its way.",
        "Your case number is {digits}.", "Please restart the router and wait two minutes.",
        "I've reset it, so please try again.", "You should see it on your next bill.",
        "We'll email you at the address we have on file.", "It should work again within the hour."]
LETTERS = "ABCDEFGHJKLMNPRSTUVWXYZ"


def conversation_lines(count: int, seed: int = 0) -> list[str]:
    """Conversational agent lines: short replies, questions, read-backs, sympathy and next steps
    (`SHORT_REPLIES`...), so the voice speaks more than its prompt templates."""
    rng = random.Random(seed)

    def fill(template: str) -> str:
        while "{" in template:  # slots may hold slots ({said} → {state} → {day})
            template = template.format(
                thing=rng.choice(THINGS), state=rng.choice(STATES), day=rng.choice(DAYS), field=rng.choice(FIELDS),
                action=rng.choice(ACTIONS), name=rng.choice(NAMES), dept=rng.choice(DEPARTMENTS),
                amount=_amount(rng), date=_date(rng), time=_time(rng), time2=_time(rng),
                digits="".join(str(rng.randint(0, 9)) for _ in range(rng.choice([4, 6, 8]))),
                said=rng.choice(SAIDS), said_cap=rng.choice(SAIDS).capitalize())
        return template

    kinds = [
        (0.22, lambda: rng.choice(SHORT_REPLIES)),
        (0.18, lambda: fill(rng.choice(SUBJECTS) + " " + rng.choice(STATES) + ".")),
        (0.15, lambda: fill(rng.choice(OPENERS) + " " + rng.choice(ASKS))),
        (0.12, lambda: fill(rng.choice(ASKS))),
        (0.13, lambda: fill(rng.choice(READ_BACKS))),
        (0.12, lambda: fill(rng.choice(OPENERS) + " " + rng.choice(NEXT))),
        (0.08, lambda: "That's " + ", ".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6))) + "."),
    ]
    weights = [w for w, _ in kinds]
    return [rng.choices(kinds, weights)[0][1]() for _ in range(count)]


def prose_lines() -> list[str]:
    from pydoc_data import topics

    text = re.sub(r"\s+", " ", " ".join(topics.topics.values()))
    keep = []
    for s in re.split(r"(?<=[.!?])\s+", text):
        if (6 <= len(s.split()) <= 22 and re.fullmatch(r"[A-Za-z ,.'?!-]+", s) and s[0].isupper()
                and not re.search(r"[A-Z]{2,}|__|\w\.\w", s)):
            keep.append(s)
    return sorted(set(keep))


def training_sentences(agent: int = 500, seed: int = 0, conversation: int = 0) -> list[str]:
    """The sentences a voice is trained on, shuffled deterministically."""
    lines = agent_lines(agent, seed) + prose_lines() + conversation_lines(conversation, seed)
    random.Random(seed).shuffle(lines)
    return lines
