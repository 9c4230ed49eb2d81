"""A queued callback that really dials: a baresip caller waits in a queue nobody can answer, presses
the callback key and hangs up. When the agent (a baresip phone) logs in, the server dials the
caller back through its trunk, says the queue's intro, puts them at their old place, and the agent
is rung and bridged with them: each hears the other (transcribed)."""

from __future__ import annotations

import re
import shutil
import time

import pytest

from callcenter.audio.wavfile import read_wav
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.fleet import control_request
from callcenter.lab.softphone import Softphone, caller_audio
from callcenter.store.callbacks import DONE, CallbackStore
from callcenter.store.db import open_database
from tests.conftest import free_tcp_port, free_udp_port, rtp_base, wait_for

pytestmark = [pytest.mark.sip, pytest.mark.slow]

if not shutil.which("baresip"):
    pytest.skip("baresip is not installed (scripts/setup installs it)", allow_module_level=True)

TOKEN = "callback-test-token"
NUMBER = "4155550199"
FLOW = """
name: desk
start: wait
queues:
  help:
    agents: [dave]
    ring_timeout_s: 10
    announce_every_s: 0
    callback_key: "1"
    callback_offer: Press 1 to be called back.
    callback_intro: The service desk, calling you back. Please hold.
    callback_retry_s: 30
nodes:
  wait:
    type: transfer
    queue: help
    text: Please hold.
    on_callback: noted
    on_failure: bye
  noted:
    type: hangup
    text: Thank you. We will call you back. Goodbye.
  bye:
    type: hangup
    text: Goodbye.
"""


def words(stt, path) -> set[str]:
    return set(re.findall(r"[a-z]+", stt.transcribe_pcm(read_wav(path)).text.lower()))


def test_a_queued_callback_dials_the_caller_when_an_agent_logs_in_and_bridges_them(tmp_path, caller_voice, stt):
    flow = tmp_path / "desk.yaml"
    flow.write_text(FLOW)
    desk_port, caller_port = free_udp_port(), free_udp_port()
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), flow, control_port=free_tcp_port(),
                         token=TOKEN, extra_config=(
                             f"contact_center:\n  agents:\n    - {{name: dave, uri: 'sip:dave@127.0.0.1:{desk_port}', "
                             f"logged_in: false}}\n"
                             f"outbound:\n  allow: ['{NUMBER}']\n  trunk: 127.0.0.1:{caller_port}\n  ring_s: 20\n"
                         )).start()
    dave_says = caller_voice("dave", "Hello, this is Dave from the service desk.")
    dave = Softphone(tmp_path / "dave", caller_audio([dave_says, dave_says], tmp_path / "dave.wav", lead_s=3,
                                                      gap_s=2, tail_s=30), user="dave", port=desk_port).start()
    # the caller only listens (and keys 1); the same phone answers the call back
    caller = Softphone(tmp_path / "caller", caller_audio([], tmp_path / "quiet.wav", lead_s=60, gap_s=0, tail_s=0),
                       user=NUMBER, port=caller_port)
    try:
        caller.dial(agent.uri)
        assert caller.wait_established(10), caller.log()
        time.sleep(3)  # "Please hold", then the callback offer
        caller.press("1")
        assert wait_for(lambda: caller.log().count("terminated") >= 1, 20), caller.log()
        callbacks = CallbackStore(open_database(agent.store))
        [waiting] = callbacks.pending()
        assert waiting.number == NUMBER and waiting.queue == "help" and waiting.attempts == 0

        control_request(agent.control_url, TOKEN, "/api/agents/dave/login", {})
        assert wait_for(lambda: caller.log().count("Call established") >= 2, 30), agent.log()[-3000:]
        assert wait_for(lambda: dave.calls_answered() >= 1, 40), agent.log()[-3000:]
        time.sleep(9)  # the whisper to dave, then the bridge: dave speaks twice
        caller.hangup()
        assert wait_for(lambda: callbacks.get(waiting.call_id).state == DONE, 20), callbacks.get(waiting.call_id)
        done = callbacks.get(waiting.call_id)
        assert done.result == "queue_answered" and done.attempts == 1
    finally:
        caller.close()
        dave.close()
        agent.stop()
    first, second = caller.received_wavs()[:2]
    said = words(stt, first)
    assert {"back", "goodbye"} <= said, said  # "We will call you back. Goodbye."
    heard = words(stt, second)
    assert {"calling", "back"} <= heard, heard  # the queue's intro
    assert {"dave", "desk"} & heard, heard  # and the agent, bridged
