"""A dialled call answered by a person: a real baresip phone answers `callcenter dial`, hears the
outbound flow with the request's variables, answers it by voice, and the call ends as its flow
says. The phone's own recording is transcribed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from callcenter.aftercall.webhook import signature
from callcenter.audio.wavfile import read_wav
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.softphone import Softphone, scripted_caller
from callcenter.store.calls import CallRecords
from callcenter.store.db import open_database
from tests.conftest import FLOW, free_tcp_port, free_udp_port, rtp_base, wait_for
from tests.test_outbound_dial import TOKEN, outbound_config

pytestmark = [pytest.mark.sip, pytest.mark.slow]

if not shutil.which("baresip"):
    pytest.skip("baresip is not installed (scripts/setup installs it)", allow_module_level=True)


class Receiver:
    """An end-of-call webhook's receiver on loopback: keeps each POST's body and headers."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        got = self.got = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.append((body, dict(self.headers)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/calls"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_a_dialled_person_hears_the_flow_with_its_variables_and_answers_it(tmp_path, stt):
    hook = Receiver()
    after_call = f"after_call:\n  webhook: {{url: '{hook.url}', backoff_s: 0.5}}\n"
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                         token=TOKEN, extra_config=outbound_config("'sip:dana@127.0.0.1:*'") + after_call,
                         env={"CALLCENTER_WEBHOOK_SECRET": "hook-secret"}).start()
    phone = None
    try:
        # the prompt takes about 7 s: Dana answers after it (an answer over it is a barge-in, heard all the same)
        (tmp_path / "mic").mkdir()
        mic = scripted_caller(["Yes, I can make it."], tmp_path / "mic", lead_s=9.0, gap_s=0.0, tail_s=8.0)
        phone = Softphone(tmp_path / "dana", mic, user="dana", port=free_udp_port()).start()
        run = subprocess.run([sys.executable, "-m", "callcenter.cli", "dial", phone.uri, "--flow", "reminder",
                              "--var", "name=Dana", "--var", "day=Monday", "--var", "at=10 am",
                              "--connect", agent.control_url, "--wait", "--timeout", "60"],
                             capture_output=True, text=True, timeout=90, env=dict(os.environ, CALLCENTER_TOKEN=TOKEN))
        assert phone.wait_ended(10), phone.log()
        heard = phone.received_wav()
        assert wait_for(lambda: hook.got, 15), agent.log()[-3000:]  # the webhook, after the call
    finally:
        if phone is not None:
            phone.close()
        agent.stop()
        hook.close()
    assert run.returncode == 0, (run.stdout, run.stderr, agent.log()[-3000:])
    call_id, result = run.stdout.split("\n")[0], json.loads(run.stdout.strip().split("\n")[-1])
    assert result["call_id"] == call_id and result["outcome"] == "ai_completed" and result["ended_by"] == "agent"

    events = [json.loads(line) for path in agent.calls() if path.stem == call_id
              for line in path.read_text().splitlines()]
    start = next(e for e in events if e["kind"] == "call_start")
    assert start["direction"] == "outbound"
    decisions = [e for e in events if e["kind"] == "flow_decision" and e.get("intent")]
    assert decisions and decisions[0]["intent"] == "yes", decisions

    says = [e["text"] for e in events if e["kind"] == "agent_say"]
    assert says[0].startswith("Hello Dana, this is Example Dental") and "on Monday at 10 am" in says[0], says
    # what the phone heard (the voice says "Dana" so that Whisper often writes "Donna": not asserted)
    heard_text = stt.transcribe_pcm(read_wav(heard)).text.lower()
    assert "example dental" in heard_text and "monday" in heard_text and "see you" in heard_text, heard_text

    rows = [c for c in CallRecords(open_database(agent.store), "", "").between(0, 2**40) if c["call_id"] == call_id]
    assert rows and rows[0]["direction"] == "outbound" and rows[0]["outcome"] == "ai_completed"
    assert rows[0]["answered"] and rows[0]["caller"] == phone.uri
    # after the call: a summary in the store, and the same in a signed webhook
    assert rows[0]["summary"].startswith(f"We called {phone.uri} (reminder)") and rows[0]["sentiment"] == "positive"
    body, headers = hook.got[0]
    sent = json.loads(body)
    assert sent["call_id"] == call_id and sent["outcome"] == "ai_completed" and sent["summary"] == rows[0]["summary"]
    # the flow's own after-call fields, in the row and the webhook alike
    # (Dana picks up in silence and first speaks at 9 s, after the detector's 8 s: unknown, not a machine)
    assert sent["after_call"] == rows[0]["after_call"] == {"confirmed": True, "wants_another_time": False,
                                                           "reached": "unknown"}, sent["after_call"]
    assert headers["X-Callcenter-Signature"] == signature("hook-secret", headers["X-Callcenter-Timestamp"], body)


def test_a_dialled_answering_machine_gets_the_message_after_its_beep(tmp_path, stt):
    """A real baresip phone answers as a voicemail machine: a long greeting, a beep, then it records
    what it hears. The agent never talks to the greeting, leaves the flow's message after the beep,
    and the row says `machine`."""
    import numpy as np

    from callcenter.audio.frames import SAMPLE_RATE, float_to_pcm, pcm_to_float
    from callcenter.audio.wavfile import write_wav
    from callcenter.lab.amd_set import tone
    from callcenter.voice.flite import flite_voice

    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, control_port=free_tcp_port(),
                         token=TOKEN, extra_config=outbound_config("'sip:machine@127.0.0.1:*'")).start()
    phone = None
    try:
        greeting = pcm_to_float(read_wav(flite_voice(
            "Hi, you have reached the voicemail of Dana Smith. I can't come to the phone right now. "
            "Please leave your name and number after the tone.", tmp_path / "greeting.wav", "slt")))
        beep_end = 0.4 + len(greeting) / SAMPLE_RATE + 0.5 + 0.5
        mic = tmp_path / "machine.wav"
        write_wav(mic, float_to_pcm(np.concatenate([np.zeros(int(0.4 * SAMPLE_RATE)), greeting * 0.5,
                                                    np.zeros(int(0.5 * SAMPLE_RATE)), tone(1000.0, 0.5),
                                                    np.zeros(int(16 * SAMPLE_RATE))])))
        phone = Softphone(tmp_path / "machine", mic, user="machine", port=free_udp_port()).start()
        run = subprocess.run([sys.executable, "-m", "callcenter.cli", "dial", phone.uri, "--flow", "reminder",
                              "--var", "name=Dana", "--var", "day=Monday", "--var", "at=10 am",
                              "--connect", agent.control_url, "--wait", "--timeout", "60"],
                             capture_output=True, text=True, timeout=90, env=dict(os.environ, CALLCENTER_TOKEN=TOKEN))
        assert phone.wait_ended(10), phone.log()
        heard = read_wav(phone.received_wav())
    finally:
        if phone is not None:
            phone.close()
        agent.stop()
    call_id = run.stdout.split("\n")[0]
    result = json.loads(run.stdout.strip().split("\n")[-1])
    assert result["outcome"] == "machine", (run.stdout, run.stderr, agent.log()[-3000:])
    events = [json.loads(line) for path in agent.calls() if path.stem == call_id
              for line in path.read_text().splitlines()]
    amd = [e for e in events if e["kind"] == "amd"]
    decided = [e for e in amd if e["what"] == "decided"]
    assert decided and decided[-1]["decision"] == "machine", amd
    assert any(e["what"] == "beep" for e in amd) and any(e["what"] == "message" and e["after"] == "beep" for e in amd)
    # what the machine recorded after its beep: the message, and nothing of it before
    cut = int(beep_end * SAMPLE_RATE) * 2
    after = stt.transcribe_pcm(heard[cut:]).text.lower()
    assert "example dental" in after and "reminder" in after and "call us back" in after, after
    before = heard[:cut]
    loud = np.abs(pcm_to_float(before)) > 0.02
    assert loud.mean() < 0.2, "the agent talked over most of the greeting"
    rows = [c for c in CallRecords(open_database(agent.store), "", "").between(0, 2**40) if c["call_id"] == call_id]
    assert rows and rows[0]["outcome"] == "machine" and rows[0]["answered"]
