"""Each part of a call on fakes (callcenter/testing): a real CallSession and flow engine, a voice
that says words as tones, a caller who speaks in text, on the virtual clock. Each test takes well
under a second; the real whole-call tests (simulate_call, SIP) stay the end-to-end checks."""

from __future__ import annotations

import asyncio
import textwrap

from callcenter.call.simulate import SimulatedLine
from callcenter.call.simulated_queue import QueueScript
from callcenter.call.state import CallState, Driver
from callcenter.dialog.flow import load_flow
from callcenter.testing import run_call

FLOW = """
name: features
start: welcome
queues:
  help:
    agents: [alice]
    max_wait_s: 30
    announce_every_s: 0
nodes:
  welcome:
    type: say
    text: Welcome.
    next: menu
  menu:
    type: ask
    prompt: How can I help?
    timeout_s: 5
    max_attempts: 2
    on_failure: bye
    intents:
      billing:
        examples: [billing, my bill]
        next: billing
      person:
        examples: [a person, an agent]
        next: wait
      card:
        examples: [pay by card]
        next: pay
  billing:
    type: say
    text: Your bill is online.
    next: bye
  pay:
    type: ask
    prompt: Your card number, please.
    on_failure: bye
    slots:
      card_number: {type: digits, min_length: 16, max_length: 16, checksum: luhn}
    next: bye
  wait:
    type: transfer
    queue: help
    on_timeout: bye
  bye:
    type: hangup
    text: Goodbye.
"""


def flow(tmp_path):
    path = tmp_path / "flow.yaml"
    path.write_text(textwrap.dedent(FLOW))
    return load_flow(path)


def test_the_flow_answers_text_and_hangs_up(tmp_path):
    async def script(call):
        await call.say("a question about my bill")

    harness, result = run_call(flow(tmp_path), script)
    assert harness.said() == ["Welcome.", "How can I help?", "Your bill is online.", "Goodbye."]
    assert result.ended_by == "agent" and result.path[-1] == "bye"


def test_supervisor_take_over_holds_the_flow_and_release_asks_again(tmp_path):
    async def script(call):
        s = call.session
        s.take_over()
        assert s.state == CallState.TAKEN_OVER and s.status.driver == Driver.SUPERVISOR
        await call.say("I was talking to the supervisor")  # heard, not answered
        assert call.said()[-1] == "How can I help?" and len(call.said()) == 2
        s.release()
        await call.settle()
        assert call.said()[-1] == "How can I help?" and len(call.said()) == 3  # asked again, no apology
        assert [d["via"] for d in call.kinds("flow_decision")][-1] == "resumed"

    run_call(flow(tmp_path), script)


def test_supervisor_hang_up_says_goodbye_first(tmp_path):
    async def script(call):
        call.session.supervisor_hangup()
        await call.settle()

    harness, result = run_call(flow(tmp_path), script)
    assert harness.said()[-1] == "Thank you for calling. Goodbye." and result.ended_by == "agent"


def test_a_failed_supervisor_transfer_leaves_the_flow_where_it_was(tmp_path):
    async def script(call):
        call.session.supervisor_transfer("sip:nobody@example.invalid")
        await call.settle()
        assert not call.session.ended.is_set()
        assert call.session.dialog.node_name == "menu"

    harness, _ = run_call(flow(tmp_path), script, line=SimulatedLine(accept_transfer=False))
    assert [t["accepted"] for t in harness.kinds("transfer") if "accepted" in t] == [False]


def test_a_queue_answered_bridges_the_caller(tmp_path):
    async def script(call):
        await call.say("an agent please")
        s = call.session
        for _ in range(200):
            if s.bridged:
                break
            await asyncio.sleep(0.1)
        assert s.bridged and s.state == CallState.BRIDGED and s.status.driver == Driver.PERSON

    harness, result = run_call(flow(tmp_path), script, line=SimulatedLine(queue=QueueScript(answers_after_s=3.0)))
    assert result.transferred_to and result.transferred_to.startswith("queue:help/")


def test_card_digits_are_masked_and_the_recording_is_private_while_they_are_given(tmp_path):
    async def script(call):
        await call.say("pay by card")
        assert call.session.bridge.private_caller  # the caller's side is out of the recording
        await call.say("4111 1111 1111 1111")

    harness, _ = run_call(flow(tmp_path), script)
    finals = [e["text"] for e in harness.kinds("stt_final")]
    assert "4111" not in " ".join(finals), finals


def test_trouble_is_taken_once_and_tells_the_caller(tmp_path):
    async def script(call):
        call.session.trouble("stt")
        call.session.trouble("tts")  # a second failure while in trouble changes nothing
        await call.settle()

    harness, result = run_call(flow(tmp_path), script)
    assert [e["stage"] for e in harness.kinds("trouble")] == ["stt"]
    assert "technical trouble" in harness.said()[-1] and result.ended_by == "agent"


VOICEMAIL_FLOW = """
name: messages
start: menu
nodes:
  menu:
    type: ask
    prompt: Say message to leave one.
    on_failure: bye
    intents:
      message:
        examples: [leave a message, voicemail]
        next: voicemail
  voicemail:
    type: voicemail
    prompt: Leave your message after the tone.
    max_s: 60
    end_silence_s: 3
    next: thanks
  thanks:
    type: branch
    cases:
      - if: voicemail_s >= 1
        next: bye
    else: nothing
  nothing:
    type: hangup
    text: Nothing was recorded. Goodbye.
  bye:
    type: hangup
    text: Thank you. Goodbye.
"""


def test_a_voicemail_is_its_own_state_and_pound_ends_it(tmp_path):
    path = tmp_path / "vm.yaml"
    path.write_text(textwrap.dedent(VOICEMAIL_FLOW))

    async def script(call):
        await call.say("I want to leave a message")
        assert call.session.state == CallState.VOICEMAIL and call.session.features.voicemail.recording
        await call.key("#")
        await call.settle()

    harness, result = run_call(load_flow(path), script)
    saved = [e for e in harness.kinds("voicemail") if e["state"] == "saved"]
    assert saved and saved[0]["ended_by"] == "nothing said"  # the caller's line carried no speech
    assert harness.said()[-1] == "Nothing was recorded. Goodbye." and result.ended_by == "agent"
    assert [e["state"] for e in harness.kinds("call_state")] == ["voicemail", "flow", "ended"]


def test_every_state_change_is_an_event_with_who_drives_the_call(tmp_path):
    async def script(call):
        await call.say("an agent please")
        for _ in range(200):
            if call.session.bridged:
                break
            await asyncio.sleep(0.1)

    harness, _ = run_call(flow(tmp_path), script, line=SimulatedLine(queue=QueueScript(answers_after_s=3.0)))
    changes = [(e["was"], e["state"], e["driver"]) for e in harness.kinds("call_state")]
    assert changes == [("flow", "queued", "flow"), ("queued", "bridged", "person"), ("bridged", "ended", "flow")]


def test_a_supervisor_takes_over_a_queue_wait_and_gives_it_back_to_the_queue(tmp_path):
    async def script(call):
        s = call.session
        asyncio.create_task(call.say("an agent please"))  # say() settles only when the wait is over
        for _ in range(100):
            if s.state == CallState.QUEUED:
                break
            await asyncio.sleep(0.1)
        assert s.state == CallState.QUEUED
        s.take_over()
        assert s.state == CallState.TAKEN_OVER and s.held
        s.release()
        assert s.state == CallState.QUEUED and not s.held

    harness, _ = run_call(flow(tmp_path), script, line=SimulatedLine(queue=QueueScript(answers_after_s=600.0)))
    assert [e["state"] for e in harness.kinds("call_state")] == ["queued", "taken over", "queued", "ended"]


def test_a_move_the_table_does_not_allow_is_refused(tmp_path):
    async def script(call):
        s = call.session
        s.pause()
        assert s.state == CallState.PAUSED
        s.take_over()  # already held: still paused
        assert s.state == CallState.PAUSED
        s.status._move(CallState.BRIDGED, "test")
        assert not s.status.enter(CallState.QUEUED, "test") and s.state == CallState.BRIDGED
        s.end("caller")
        assert not s.status.enter(CallState.FLOW) and s.state == CallState.ENDED

    run_call(flow(tmp_path), script)


def test_the_real_parts_have_every_member_their_port_names():
    """call/ports.py against what is plugged in live: a drifted port fails here, not on a call."""
    from callcenter.call import ports
    from callcenter.call.bridge import MediaBridge
    from callcenter.hearing.stt import WhisperStt
    from callcenter.telephony.sip_call import SipLiveCall
    from callcenter.telephony.webrtc_call import WebRtcLiveCall
    from callcenter.testing.harness import FakeRecognizer, FakeVoice
    from callcenter.voice.speaker import Speaker

    def members(protocol) -> set[str]:
        own = set(vars(protocol)) | set(getattr(protocol, "__annotations__", {}))
        return {m for m in own if not m.startswith("_") and m != "copy_with"}  # typing's own

    loop = asyncio.new_event_loop()
    try:
        bridge = MediaBridge(loop, None)
    finally:
        loop.close()
    plugged = {ports.MediaLine: [bridge], ports.Recognizer: [WhisperStt, FakeRecognizer],
               ports.Voice: [Speaker, FakeVoice], ports.CallControl: [SipLiveCall, WebRtcLiveCall]}
    for port, parts in plugged.items():
        assert members(port), port
        for part in parts:
            missing = {m for m in members(port) if not hasattr(part, m)}
            assert not missing, f"{part} lacks {missing} of {port.__name__}"
