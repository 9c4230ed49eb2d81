"""Answering-machine detection: the detector on greetings made here (flite), and a dialled call on
the virtual clock whose far end is a person or a machine. Real calls: tests/test_outbound_calls.py
and `callcenter bench amd`."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from callcenter.audio.frames import FRAME_MS, SAMPLE_RATE, float_to_pcm, frames_from_pcm, pcm_to_float
from callcenter.audio.stage import Moment
from callcenter.audio.wavfile import read_wav
from callcenter.call import events as ev
from callcenter.dialog.flow import load_flow
from callcenter.hearing.amd import (
    MACHINE,
    PERSON,
    UNKNOWN,
    AnsweringMachineDetector,
    BeepEnded,
    Decided,
    Greeted,
    GreetingOver,
    WantWords,
)
from callcenter.hearing.stt import Transcript
from callcenter.lab.amd_set import tone
from callcenter.store.calls import MACHINE as MACHINE_OUTCOME
from callcenter.testing import run_call
from callcenter.voice.flite import flite_voice
from callcenter.yamlfile import UserFileError

BEEP_HZ, BEEP_S = 1000.0, 0.5


@pytest.fixture(scope="module")
def say(tmp_path_factory):
    folder = tmp_path_factory.mktemp("amd")

    def speak(text: str, voice: str = "kal") -> np.ndarray:
        path = flite_voice(text, folder / f"{abs(hash((text, voice)))}.wav", voice)
        x = pcm_to_float(read_wav(path))
        loud = np.flatnonzero(np.abs(x) > 0.01 * np.abs(x).max())
        return x[loud[0]:loud[-1] + 1] * 0.3 / (np.abs(x).max() + 1e-9)
    return speak


def gap(s: float) -> np.ndarray:
    return np.zeros(int(s * SAMPLE_RATE))


def clip(*parts: np.ndarray) -> bytes:
    return float_to_pcm(np.concatenate(parts))


def run(pcm: bytes, words=lambda pcm: "") -> tuple[list, AnsweringMachineDetector]:
    """Every event of the detector over `pcm`, the recognizer's words delivered at once."""
    det, out = AnsweringMachineDetector(), []
    for frame in frames_from_pcm(pcm):
        for e in det.process(frame, Moment(det.t)):
            out.append(e)
            if isinstance(e, WantWords):
                out += det.heard(words(e.pcm))
    return out, det


def test_a_person_who_says_hello_starts_the_flow_at_once_and_is_a_person_within_a_second(say):
    hello = say("Hello?")
    end = 0.4 + len(hello) / SAMPLE_RATE
    events, det = run(clip(gap(0.4), hello, gap(6.0)))
    greeted = next(e for e in events if isinstance(e, Greeted))
    assert greeted.t - end <= 0.25  # the flow's prompt can reach them within 300 ms
    decided = [e for e in events if isinstance(e, Decided)]
    assert [d.label for d in decided] == [PERSON]
    assert decided[0].t - end <= 1.0


def test_a_long_greeting_is_a_machine_and_its_beep_ends_the_wait(say):
    greeting = say("Hi, you have reached the voicemail of Dana Smith. I can't come to the phone right now, "
                   "so please leave your name, your number and a short message after the tone.")
    beep_at = 0.3 + len(greeting) / SAMPLE_RATE + 0.4
    events, det = run(clip(gap(0.3), greeting, gap(0.4), tone(BEEP_HZ, BEEP_S), gap(3.0)))
    decided = [e for e in events if isinstance(e, Decided)]
    assert decided[0].label == MACHINE and decided[0].t < beep_at, decided  # by its length, before the beep
    beep = next(e for e in events if isinstance(e, BeepEnded))
    assert abs(beep.end - (beep_at + BEEP_S)) <= 0.04 and abs(beep.hz - BEEP_HZ) < 30
    assert not any(isinstance(e, GreetingOver) for e in events)


def test_a_short_greeting_starts_the_flow_then_the_beep_says_machine(say):
    events, det = run(clip(gap(0.2), say("Leave a message."), gap(0.5), tone(850.0, 0.3), gap(3.0)))
    kinds = [type(e).__name__ for e in events if not isinstance(e, WantWords)]
    assert kinds.index("Greeted") < kinds.index("Decided")
    assert det.decision.label == MACHINE and "beep" in det.decision.why


def test_a_machines_words_revise_a_person_and_a_greeting_without_a_beep_ends_by_quiet(say):
    # "Hi!" and a long pause sounds like a person; the words that follow give the machine away
    events, det = run(clip(gap(0.2), say("Hi!"), gap(1.2), say("You have reached Dana. Leave a message."), gap(4.0)),
                      words=lambda pcm: "you have reached dana. leave a message." if len(pcm) > 2 * SAMPLE_RATE else "hi")
    decided = [e for e in events if isinstance(e, Decided)]
    assert [d.label for d in decided] == [PERSON, MACHINE] and decided[1].revised
    assert any(isinstance(e, GreetingOver) for e in events)


def test_a_business_answering_in_a_persons_words_is_a_person(say):
    greeting = say("Good afternoon, Acme Dental, this is Dana speaking, how can I help you today?")
    events, det = run(clip(gap(0.3), greeting, gap(8.0)),
                      words=lambda pcm: "good afternoon, acme dental, this is dana speaking, how can i help you today?")
    assert det.decision.label == PERSON and det.greeted is not None


def test_a_silent_pickup_starts_the_flow_and_stays_unknown():
    events, det = run(bytes(int(9 * SAMPLE_RATE) * 2))
    greeted = next(e for e in events if isinstance(e, Greeted))
    assert greeted.t == pytest.approx(det.s.silent_pickup_s, abs=FRAME_MS / 1000)
    assert det.decision.label == UNKNOWN and det.done


def test_keypad_tones_and_a_voice_are_not_beeps(say):
    t = np.arange(int(0.4 * SAMPLE_RATE)) / SAMPLE_RATE
    dtmf = 0.1 * (np.sin(2 * np.pi * 697 * t) + np.sin(2 * np.pi * 1209 * t))
    events, det = run(clip(gap(0.3), say("Hello?", "slt"), gap(0.3), dtmf, gap(3.0)))
    assert not any(isinstance(e, BeepEnded) for e in events)


# ------------------------------------------------------------------ a dialled call, virtual clock
FLOW = """
name: remind
variables: {name: ""}
voicemail_drop: Hello {name}, this is Example Dental about your appointment. Please call us back.
start: ask
nodes:
  ask:
    type: ask
    prompt: Hello {name}, this is Example Dental with a reminder of your appointment tomorrow. Can you make it?
    intents:
      yes: {examples: [yes], next: bye}
    no_match: Sorry?
    on_failure: bye
  bye: {type: hangup, text: Goodbye.}
"""


class Words:
    """The recognizer: what the far end's greeting says."""

    def __init__(self, text: str):
        self.text, self.asked = text, 0

    def transcribe_pcm(self, pcm, rate=SAMPLE_RATE, hint=None, grammar=None):
        self.asked += 1
        return Transcript(self.text, 0.9, 0.05, len(pcm) / 2 / rate)


def dialled(tmp_path, far_end: bytes, words: str, flow_text: str = FLOW, wait_s: float = 14.0):
    path = tmp_path / "remind.yaml"
    path.write_text(flow_text)

    async def script(h):
        await asyncio.sleep(wait_s)
    return run_call(load_flow(path), script, variables={"direction": "outbound", "name": "Dana"}, far_end=far_end,
                    stt=Words(words))


def first_sound_after(pcm: bytes, t: float) -> float:
    x = pcm_to_float(pcm)
    i = int(t * SAMPLE_RATE)
    return (i + int(np.flatnonzero(np.abs(x[i:]) > 0.01)[0])) / SAMPLE_RATE


def test_a_dialled_person_hears_the_prompt_as_soon_as_their_hello_ends(tmp_path, say):
    hello = say("Hello?")
    end = 0.5 + len(hello) / SAMPLE_RATE
    harness, result = dialled(tmp_path, clip(gap(0.5), hello), "hello?", wait_s=4.0)
    amd = [e for e in harness.kinds(ev.AMD) if e["what"] != "words"]
    assert [e["what"] for e in amd] == ["greeted", "decided"] and amd[1]["decision"] == PERSON
    assert harness.said()[0].startswith("Hello Dana, this is Example Dental")
    assert first_sound_after(bytes(harness.heard), end) - end <= 0.3  # no dead air after their hello
    assert harness.session.dialog.variables["amd"] == PERSON


def test_a_machine_stops_the_flow_and_gets_the_message_after_its_beep(tmp_path, say):
    greeting = say("Hi, you have reached Dana. I am not available. Please leave a message after the tone.")
    beep_end = 0.3 + len(greeting) / SAMPLE_RATE + 0.5 + BEEP_S
    harness, result = dialled(tmp_path, clip(gap(0.3), greeting, gap(0.5), tone(BEEP_HZ, BEEP_S)),
                              "hi, you have reached dana. i am not available.")
    amd = {e["what"]: e for e in harness.kinds(ev.AMD)}
    assert amd["decided"]["decision"] == MACHINE and amd["message"]["after"] == "beep"
    assert amd["message"]["text"].startswith("Hello Dana, this is Example Dental about your appointment")
    assert not [s for s in harness.said() if "Can you make it" in s]  # the flow never talked to the machine
    start = first_sound_after(bytes(harness.heard), beep_end)
    assert start - beep_end <= 0.5
    assert harness.line.hung_up and result.ended_by == "agent"
    from callcenter.call.outcome import outcome_of
    assert outcome_of([e.as_dict() for e in harness.events.history], result.ended_by) == MACHINE_OUTCOME


def test_a_flow_without_a_message_hangs_up_on_a_machine_and_inbound_calls_are_not_screened(tmp_path, say):
    greeting = say("Hi, you have reached Dana. Please leave a message after the tone.")
    no_drop = FLOW.replace("voicemail_drop: Hello {name}, this is Example Dental about your appointment. "
                           "Please call us back.\n", "")
    harness, result = dialled(tmp_path, clip(gap(0.3), greeting, gap(0.5), tone(BEEP_HZ, BEEP_S)),
                              "you have reached dana", flow_text=no_drop)
    assert [e["what"] for e in harness.kinds(ev.AMD)][-1] == "hangup" and harness.line.hung_up

    path = tmp_path / "in.yaml"
    path.write_text(FLOW)

    async def script(h):
        await asyncio.sleep(1.0)
    harness, _ = run_call(load_flow(path), script)
    assert not harness.kinds(ev.AMD) and harness.said()[0].startswith("Hello , this is")


def test_the_checker_finds_a_misspelt_variable_in_the_voicemail_message(tmp_path):
    path = tmp_path / "remind.yaml"
    path.write_text(FLOW.replace("Hello {name}, this is Example Dental about", "Hello {nmae}, this is Example Dental about"))
    with pytest.raises(UserFileError) as e:
        load_flow(path)
    assert "remind.yaml:4:" in str(e.value) and "unknown variable 'nmae'" in str(e.value) and "name" in str(e.value)


class ByLength(Words):
    """What each stretch of a machine's greeting says, told apart by its length."""

    def __init__(self, short_s: float, middle_s: float):
        super().__init__("")
        self.short_s, self.middle_s = short_s, middle_s

    def transcribe_pcm(self, pcm, rate=SAMPLE_RATE, hint=None, grammar=None):
        self.asked += 1
        seconds = len(pcm) / 2 / rate
        text = "hi, jorge here." if seconds < self.short_s else "yes, sorry i missed your call today." \
            if seconds < self.middle_s else "please leave a message after the tone."
        return Transcript(text, 0.9, 0.05, seconds)


def test_a_machines_greeting_over_the_first_prompt_is_never_taken_for_an_answer(tmp_path, say):
    """"Hi, Jorge here." and a short pause (the flow starts), then "Yes, sorry I missed your call
    today." (which would answer the prompt's yes-or-no) and a pause, then "Please leave a message":
    words heard while the detector decides wait for it, and a machine's are dropped."""
    first, second = say("Hi, Jorge here."), say("Yes, sorry I missed your call today.")
    third = say("Please leave a message after the tone, and have a nice day.")
    far_end = clip(gap(0.2), first, gap(0.35), second, gap(1.2), third, gap(0.5), tone(BEEP_HZ, BEEP_S))
    path = tmp_path / "remind.yaml"
    path.write_text(FLOW)
    words = ByLength(len(first) / SAMPLE_RATE + 0.4, len(second) / SAMPLE_RATE + 0.6)

    async def script(h):
        await asyncio.sleep(18.0)
    harness, result = run_call(load_flow(path), script, variables={"direction": "outbound", "name": "Dana"},
                               far_end=far_end, stt=words)
    whats = [e["what"] for e in harness.kinds(ev.AMD)]
    assert whats[0] == "greeted" and "message" in whats, whats
    assert harness.kinds(ev.FLOW_DECISION) == []  # no answer, no "Sorry?": the flow heard nothing of it
    assert not [t for t in harness.said() if t.startswith("Sorry?") or t == "Goodbye."], harness.said()
