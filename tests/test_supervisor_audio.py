"""Supervisor audio over real SIP: the console's listen, whisper and barge call the supervisor's own
baresip phone and join it to a live call, on a call with the AI agent alone and on a call bridged
to a human agent from a queue. Each phone's microphone says a different word in each mode, and what
every phone heard is transcribed: who heard what."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request

import pytest

from callcenter.audio.wavfile import read_wav
from callcenter.call.events import read_events
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.softphone import Softphone, caller_audio
from tests.conftest import FLOW, free_tcp_port, free_udp_port, rtp_base

pytestmark = [pytest.mark.sip, pytest.mark.slow]

if not shutil.which("baresip"):
    pytest.skip("baresip is needed (scripts/setup installs it)", allow_module_level=True)

TOKEN = "supervisor-audio-token"
# the supervisor's microphone, from the moment their phone answers: one word per mode
LISTEN_AT, WHISPER_AT, BARGE_AT, LEAVE_AT = 0.0, 4.5, 10.5, 17.0


def post(agent: AgentProcess, call_id: str, action: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"{agent.control_url}/api/calls/{call_id}/{action}",
                                 data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=40) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{action}: {exc.code} {exc.read().decode()}") from None


def live_call(agent: AgentProcess) -> str:
    req = urllib.request.Request(f"{agent.control_url}/api/calls", headers={"Authorization": f"Bearer {TOKEN}"})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with urllib.request.urlopen(req, timeout=10) as r:
            calls = json.loads(r.read())["calls"]
        if calls:
            return calls[0]["call_id"]
        time.sleep(0.2)
    raise AssertionError("no live call")


def heard_words(stt, phone: Softphone) -> set[str]:
    out: set[str] = set()
    for wav in phone.received_wavs():
        pcm = read_wav(wav)
        for start in range(0, len(pcm), 16000 * 25):  # the recognizer's window is 30 s
            out |= set(re.findall(r"[a-z]+", stt.transcribe_pcm(pcm[start:start + 16000 * 25]).text.lower()))
    return out


def heard_text(stt, phone: Softphone) -> str:
    """What `phone` heard, transcribed, digits kept (lower case)."""
    out = []
    for wav in phone.received_wavs():
        pcm = read_wav(wav)
        for start in range(0, len(pcm), 16000 * 25):
            out.append(stt.transcribe_pcm(pcm[start:start + 16000 * 25]).text.lower())
    return " ".join(out)


def supervisor_phone(tmp_path, caller_voice) -> Softphone:
    words = [caller_voice("sup_zebra", "Zebra crossing."),
             caller_voice("sup_pineapple", "Please mention the pineapple offer."),
             caller_voice("sup_elephant", "Hello, this is the supervisor. Elephant.")]
    # each word a second after its mode starts: zebra while listening, pineapple while whispering,
    # elephant after barging in
    mic = tmp_path / "sup-mic.wav"
    from callcenter.audio.wavfile import write_wav

    pcm, at = b"", 0.0
    for wav, start in zip(words, (LISTEN_AT + 1.0, WHISPER_AT + 1.0, BARGE_AT + 1.0)):
        gap = max(0.0, start - at)
        speech = read_wav(wav)
        pcm += bytes(int(gap * 8000) * 2) + speech
        at = start + len(speech) / 16000
    write_wav(mic, pcm + bytes(int((LEAVE_AT + 3 - at) * 8000) * 2))
    return Softphone(tmp_path / "sup", mic, user="sup", port=free_udp_port()).start()


def run_modes(agent: AgentProcess, call_id: str, sup: Softphone) -> None:
    post(agent, call_id, "listen", {"phone": sup.uri})  # returns once the supervisor's phone answered
    t0 = time.monotonic()
    for mode, at in (("whisper", WHISPER_AT), ("barge", BARGE_AT), ("leave", LEAVE_AT)):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        post(agent, call_id, mode)


def test_listen_whisper_barge_on_a_call_with_the_ai_agent(tmp_path, caller_voice, stt):
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                         token=TOKEN).start()
    sup = supervisor_phone(tmp_path, caller_voice)
    try:
        mic = caller_audio([], tmp_path / "mic.wav", lead_s=45, gap_s=0, tail_s=0)
        with Softphone(tmp_path / "caller", mic) as caller:
            caller.dial(agent.uri)
            assert caller.wait_established(10), caller.log()
            call_id = live_call(agent)
            time.sleep(6)  # the greeting and menu prompt are over
            run_modes(agent, call_id, sup)
            time.sleep(2)
            caller.hangup()
            time.sleep(1)
        sup.close()
        events = read_events(agent.calls()[0])
        actions = [e["action"] for e in events if e["kind"] == "supervisor"]
        assert actions[:2] == ["listen", "whisper"] and "barge" in actions and actions[-1] == "leave", actions
        said = [e["text"] for e in events if e["kind"] == "supervisor" and e["action"] == "say"]
        assert any("pineapple" in t.lower() for t in said), said  # whispered to the AI: it said it
        caller_heard, sup_heard = heard_words(stt, caller), heard_words(stt, sup)
        assert "pineapple" in caller_heard, caller_heard  # in the agent's voice
        assert "elephant" in caller_heard, caller_heard  # the supervisor's own voice, barging in
        assert "zebra" not in caller_heard, caller_heard  # nobody hears a listening supervisor
        assert "pineapple" in sup_heard, sup_heard  # the supervisor hears the agent
    finally:
        sup.close()
        agent.stop()


QUEUE_FLOW = """
name: desk
start: wait
queues:
  help:
    agents: [dave]
    ring_timeout_s: 10
    announce_every_s: 0
    callback_key: null
nodes:
  wait:
    type: transfer
    queue: help
    text: Putting you through.
    on_failure: bye
  bye:
    type: hangup
    text: Goodbye.
"""


def test_listen_whisper_barge_on_a_call_bridged_to_a_human_agent(tmp_path, caller_voice, stt):
    flow = tmp_path / "desk.yaml"
    flow.write_text(QUEUE_FLOW)
    desk_port = free_udp_port()
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), flow, control_port=free_tcp_port(),
                         token=TOKEN, extra_config=(
                             f"contact_center:\n  agents:\n    - {{name: dave, uri: 'sip:dave@127.0.0.1:{desk_port}'}}\n"
                         )).start()
    sup = supervisor_phone(tmp_path, caller_voice)
    desk_says = caller_voice("desk", "The service desk is listening.")
    caller_says = caller_voice("caller_again", "I am still here with my question.")
    # dave hears the whisper first, then talks; the caller talks a little later, then again
    dave_mic = caller_audio([desk_says, desk_says], tmp_path / "dave.wav", lead_s=5, gap_s=8, tail_s=40)
    caller_mic = caller_audio([caller_says, caller_says, caller_says], tmp_path / "caller.wav", lead_s=9,
                              gap_s=5, tail_s=40)
    dave = Softphone(tmp_path / "dave", dave_mic, user="dave", port=desk_port).start()
    try:
        with Softphone(tmp_path / "caller", caller_mic) as caller:
            caller.dial(agent.uri)
            assert caller.wait_established(10), caller.log()
            call_id = live_call(agent)
            deadline = time.monotonic() + 30
            while dave.calls_answered() == 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(4)  # the whisper summary is over: dave and the caller are bridged
            run_modes(agent, call_id, sup)
            time.sleep(2)
            caller.hangup()
            time.sleep(1)
        events = read_events(agent.calls()[0])
        assert any(e["kind"] == "transfer" and e.get("mode") == "queue" for e in events)
        caller_heard, dave_heard, sup_heard = heard_words(stt, caller), heard_words(stt, dave), heard_words(stt, sup)
        assert "pineapple" in dave_heard and "elephant" in dave_heard, dave_heard  # whisper and barge
        assert "pineapple" not in caller_heard and "elephant" in caller_heard, caller_heard  # barge only
        assert "zebra" not in caller_heard and "zebra" not in dave_heard  # listening: heard by nobody
        assert {"desk", "listening"} & sup_heard and {"still", "question"} & sup_heard, sup_heard  # both sides
    finally:
        dave.close()
        sup.close()
        agent.stop()


def test_a_listening_supervisor_hears_no_card_number(tmp_path, caller_voice, stt):
    """A supervisor listens from the start of a card payment (tests/flows/payment.yaml): while the
    caller says the number and while the agent reads it back in full (`reveal`), their phone hears
    neither side; the console is told (`privacy` events). Before and after, they hear the call."""
    from tests.conftest import ROOT

    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), ROOT / "tests" / "flows" / "payment.yaml",
                         control_port=free_tcp_port(), token=TOKEN).start()
    # 4026 8234 5672 1379 (groups unlike each other: the recognizer folds a repeated phrase into one):
    # the prompts that may be heard say "ending in 1 3 7 9"; only the caller's number and the private
    # read-back say "two"
    card = caller_voice("card_4026_1379", "four oh two six, eight two three four, five six seven two, one three seven nine.")
    sup = Softphone(tmp_path / "sup", caller_audio([], tmp_path / "sup-mic.wav", lead_s=40, gap_s=0, tail_s=0),
                    user="sup", port=free_udp_port()).start()
    try:
        mic = caller_audio([card], tmp_path / "mic.wav", lead_s=6, gap_s=0, tail_s=25)
        with Softphone(tmp_path / "caller", mic) as caller:
            caller.dial(agent.uri)
            assert caller.wait_established(10), caller.log()
            post(agent, live_call(agent), "listen", {"phone": sup.uri})
            assert caller.wait_ended(45), caller.log()
        time.sleep(1)
        sup.close()
        events = read_events(agent.calls()[0])
        privacy = [e["private"] for e in events if e["kind"] == "privacy"]
        assert privacy[:1] == [True] and privacy[-1] is False and privacy.count(True) >= 2, privacy
        assert any(e["kind"] == "agent_say" and "the number is" in e["text"] for e in events)
        assert any(e["kind"] == "flow_decision" and e.get("value") == "************1379" for e in events)
        caller_heard, sup_heard = heard_text(stt, caller), heard_text(stt, sup)
        two = re.compile(r"2|\btwo\b")
        assert two.search(caller_heard), caller_heard  # the read-back, to the caller only
        assert not two.search(sup_heard), sup_heard  # neither the caller's number nor the read-back
        assert re.search(r"goodbye|noted|thank|ending", sup_heard), sup_heard  # but the rest of the call
    finally:
        sup.close()
        agent.stop()
