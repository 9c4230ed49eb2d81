"""A supervisor takes a call over, the caller talks to them, and they give the call back: the flow
asks its question again, and never says "I didn't hear anything" to a caller who was talking.
A whole call offline on the virtual clock (the same CallSession as a live one)."""

import asyncio

import pytest

from callcenter.call import session as session_module
from callcenter.call.events import read_events
from callcenter.call.simulate import CallerStep, simulate_call
from callcenter.call.virtual_clock import run_virtual
from callcenter.dialog.flow import load_flow
from tests.conftest import FLOW

pytestmark = pytest.mark.slow


def test_a_call_given_back_after_the_caller_talked_to_the_supervisor_is_asked_again(tmp_path, stt, tts,
                                                                                   caller_voice, monkeypatch):
    flow = load_flow(FLOW)
    sessions = []
    real_init = session_module.CallSession.__init__

    def keep(self, *args, **kwargs):
        sessions.append(self)
        real_init(self, *args, **kwargs)
    monkeypatch.setattr(session_module.CallSession, "__init__", keep)

    async def supervisor():
        while not sessions or sessions[0].utterances_spoken == 0 or sessions[0].busy:
            await asyncio.sleep(0.02)
        call = sessions[0]
        call.take_over()  # the greeting is over: the flow waits for the caller
        while not any(e.kind == "stt_final" for e in call.events.history):
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
        call.release()

    async def run():
        task = asyncio.create_task(supervisor())
        steps = [CallerStep(wav=caller_voice("thanks_supervisor", "Thank you, that is all I wanted to know.")),
                 CallerStep(silence_s=10.0)]
        await simulate_call(flow, steps, tmp_path, stt, tts, call_id="r")
        await task

    run_virtual(run())
    events = read_events(tmp_path / "r.jsonl")
    released = next(e["t"] for e in events if e["kind"] == "supervisor" and e["action"] == "release")
    after = [e for e in events if e["t"] >= released]
    said = [e["text"] for e in after if e["kind"] == "agent_say"]
    question = flow.nodes["main_menu"].prompt.strip()
    assert said and said[0] == question, said
    assert "didn't hear" not in said[0]  # (a silence after the question gets its reprompt, as any would)
    resumed = [e for e in after if e["kind"] == "flow_decision" and e.get("via") == "resumed"]
    assert resumed and resumed[0]["node"] == "main_menu"
