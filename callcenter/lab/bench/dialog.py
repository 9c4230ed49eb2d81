"""`callcenter bench nlu`: how well the offline intent matching understands callers who do not use
the flow's example phrases.

The test set below is callers' sentences written for this benchmark (none is an example phrase of
the flow), labelled with the intent a person would pick, or `None` when the flow cannot help (out of
scope: the right answer is "no match", which leads to a reprompt, not a wrong transfer). Each
matcher is scored on: right intent, wrong intent (the costly error: the caller is sent to the wrong
place), no match; and time per sentence.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from callcenter.dialog.flow import LlmNode, load_flow
from callcenter.dialog.nlu import IntentMatcher, SemanticMatcher

FLOW = Path(__file__).resolve().parents[3] / "flows" / "triage.yaml"
NODE = "triage"

TEST_SET: list[tuple[str, str | None]] = [
    # billing
    ("there's a charge on my statement I don't recognise", "billing"),
    ("why is my bill so high this month", "billing"),
    ("I paid twice by mistake", "billing"),
    ("can I get my money back", "billing"),
    ("I'd like to set up a direct debit", "billing"),
    ("my invoice has the wrong amount", "billing"),
    ("how much do I owe you", "billing"),
    ("I want to change my payment card", "billing"),
    ("you overcharged me", "billing"),
    ("I have a question about a payment", "billing"),
    ("the price went up without warning", "billing"),
    ("can I pay by card over the phone", "billing"),
    # outage
    ("nothing works in my whole street since this morning", "outage"),
    ("is the network down right now", "outage"),
    ("my neighbours have no internet either", "outage"),
    ("is there a problem in the Riverside area", "outage"),
    ("no service at all in my town today", "outage"),
    ("are you having an outage", "outage"),
    ("the whole building lost connection", "outage"),
    ("is something wrong with your network", "outage"),
    ("when will the service be back in Old Town", "outage"),
    ("there's a blackout of the internet here", "outage"),
    # technical
    ("my router keeps restarting", "technical"),
    ("the wifi is really slow in the evenings", "technical"),
    ("I can't connect my laptop to the internet", "technical"),
    ("I forgot my email password", "technical"),
    ("my phone says no signal", "technical"),
    ("the lights on the modem are blinking red", "technical"),
    ("I need help setting up my new router", "technical"),
    ("my TV box won't load anything", "technical"),
    ("the connection drops every few minutes", "technical"),
    ("I can't make calls on my mobile", "technical"),
    # operator (the flow's global intent)
    ("can I talk to someone please", "operator"),
    ("put me through to a human", "operator"),
    ("I want to speak to a real person", "operator"),
    ("get me a representative", "operator"),
    ("transfer me to an agent", "operator"),
    ("I'd rather talk to a person", "operator"),
    # out of scope: no intent is right
    ("what's the weather like tomorrow", None),
    ("I'd like to order a pizza", None),
    ("um hello", None),
    ("can you tell me a joke", None),
    ("what time is it", None),
    ("I'm calling about my car insurance", None),
    ("yes", None),
    ("sorry who is this", None),
]


def _examples(flow) -> dict[str, list[str]]:
    node = flow.nodes[NODE]
    assert isinstance(node, LlmNode)
    out = {name: [c.description, *c.examples] for name, c in node.choices.items()}
    out.update({name: list(g.examples) for name, g in flow.globals.intents.items()})
    return out


def score(matcher, rows=TEST_SET) -> dict:
    right = wrong = none = 0
    wrong_cases, times, got_all = [], [], {}
    for text, want in rows:
        t0 = time.perf_counter()
        got = got_all[text] = matcher.match(text).intent
        times.append(time.perf_counter() - t0)
        if got == want:
            right += 1
        elif got is None:
            none += 1
        else:
            wrong += 1
            wrong_cases.append({"text": text, "expected": want, "got": got})
    n = len(rows)
    in_scope = sum(1 for _, w in rows if w is not None)
    return {
        "sentences": n,
        "right": round(right / n, 3),
        "wrong_intent": round(wrong / n, 3),
        "no_match": round(none / n, 3),
        "in_scope_recognised": round(sum(1 for t, w in rows if w is not None and got_all[t] == w) / in_scope, 3),
        "out_of_scope_rejected": round(sum(1 for t, w in rows if w is None and got_all[t] is None)
                                       / (n - in_scope), 3),
        "ms_per_sentence_p50": round(statistics.median(times) * 1000, 2),
        "wrong_cases": wrong_cases,
    }


class ModelMatcher:
    """The offline generative model as an intent matcher: the triage node's choices and the flow's
    global intents as one list of choices; the reply's `choice:` line is the answer (decoding stops
    after it). With `first`, a hybrid: `first` decides when it is sure, the model only otherwise."""

    def __init__(self, flow, first=None):
        import threading

        from callcenter.dialog.engine import LlmRequest
        from callcenter.dialog.local_llm import LocalModel, system_prompt

        node = flow.nodes[NODE]
        choices = {name: (c.description, tuple(c.examples)) for name, c in node.choices.items()}
        choices.update({name: ("the caller asks for a person (an operator, a human, an agent)",
                               tuple(g.examples)) for name, g in flow.globals.intents.items()})
        self._request = lambda text: LlmRequest(node=NODE, provider="local-llm", instructions=node.instructions,
                                                knowledge=None, choices=choices, slots={}, tools={}, history=(),
                                                utterance=text, time_budget_s=30, fallback="")
        self.system = system_prompt(self._request(""))
        self.model = LocalModel.shared()
        self.first = first
        self.paths: dict[str, list[float]] = {"first": [], "model": []}
        self._threading = threading

    def match(self, text: str):
        from callcenter.dialog.local_llm import ReplyParser, turn_prompt
        from callcenter.dialog.nlu import IntentMatch

        t0 = time.perf_counter()
        if self.first is not None:
            quick = self.first.match(text)
            if quick.intent is not None:
                self.paths["first"].append(time.perf_counter() - t0)
                return quick
        request = self._request(text)
        parser = ReplyParser(request, lambda _: None)
        stop = self._threading.Event()

        def on_text(delta: str) -> None:
            parser.feed(delta)
            if "choice" in parser.fields or parser.saying:
                stop.set()
        choice_p = self.model.generate(self.system, turn_prompt(request), on_text, stop, max_new_tokens=16)
        reply = parser.close(choice_p)
        self.paths["model"].append(time.perf_counter() - t0)
        return IntentMatch(reply.choice, 1.0 if reply.choice else 0.0, 0.0)

    def path_summary(self) -> dict:
        n = sum(len(v) for v in self.paths.values())
        return {"share_to_model": round(len(self.paths["model"]) / n, 3) if n else None,
                **{f"{k}_ms_p50": round(statistics.median(v) * 1000, 1) for k, v in self.paths.items() if v}}


def run_nlu_bench(out: Path, model: bool | None = None) -> dict:
    from callcenter.dialog.embed import shared_encoder

    flow = load_flow(FLOW)
    examples = _examples(flow)
    t0 = time.perf_counter()
    encoder = shared_encoder()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    semantic = SemanticMatcher(examples, encoder)
    index_s = time.perf_counter() - t0
    report = {
        "flow": str(FLOW), "node": NODE, "intents": sorted(examples),
        "words_only": score(IntentMatcher(examples)),
        "words_then_embeddings": score(semantic),
        "encoder_load_s": round(load_s, 2),
        "index_examples_s": round(index_s, 3),
    }
    import os

    from callcenter.dialog.llm_model import installed
    from callcenter.dialog.local_llm import OFF_ENV

    if model or (model is None and installed() and os.environ.get(OFF_ENV, "").lower() != "off"):
        alone = ModelMatcher(flow)
        report["model_only"] = {**score(alone), **alone.path_summary()}
        hybrid = ModelMatcher(flow, first=semantic)
        report["hybrid"] = {**score(hybrid), **hybrid.path_summary()}
        report["model"] = "Qwen2.5-Coder-1.5B-Instruct, CTranslate2 int8, 2 threads, greedy"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return report
