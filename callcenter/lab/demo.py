"""`callcenter demo`: start the agent on the embedded defaults and place a real SIP call to it with
baresip. The caller asks about a bill by voice, then says that's all; the agent answers and hangs up.
Prints the conversation and where the recording, the transcript and the caller's audio are."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from callcenter.call.events import read_events
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.softphone import Softphone, scripted_caller
from callcenter.telephony.config import load_server_config

DEMO_LINES = ("I have a question about my bill", "No thanks, that's all")


def run_demo(config: str, flow: str, out: Path) -> int:
    cfg = load_server_config(config)
    work = Path(tempfile.mkdtemp(prefix="callcenter-demo-"))
    mic = scripted_caller(DEMO_LINES, work, lead_s=13.0, gap_s=11.0, tail_s=8.0)
    agent = AgentProcess(work, cfg.listen.port, cfg.rtp_port, flow, recordings=cfg.recordings)
    print(f"starting the agent on udp 127.0.0.1:{cfg.listen.port} (loading speech models)...")
    agent.start()
    before = set(agent.calls())
    try:
        print(f"calling {agent.uri} with baresip; the call lasts about 45 s...")
        with Softphone(work / "phone", mic) as phone:
            phone.dial(agent.uri)
            if not phone.wait_established(10):
                print(phone.log()[-2000:])
                return 1
            phone.wait_ended(120)
            heard = phone.received_wav()
            out.mkdir(parents=True, exist_ok=True)
            if heard:
                shutil.copy(heard, out / "caller-heard.wav")
    finally:
        agent.stop()
    new = sorted(set(agent.calls()) - before)
    if not new:
        print("no call was recorded; agent log:\n" + agent.log()[-3000:])
        return 1
    jsonl = new[-1]
    print()
    for e in read_events(jsonl):
        if e["kind"] == "agent_say":
            print(f"  agent  [{e['t']:6.2f}s] {e['text']}")
        elif e["kind"] == "stt_final":
            print(f"  caller [{e['t']:6.2f}s] {e['text']}")
        elif e["kind"] == "flow_decision":
            print(f"         [{e['t']:6.2f}s] -> {e['intent'] or e['via']} (node {e['next_node']})")
    print()
    print(f"recording (left caller, right agent): {jsonl.with_suffix('.wav')}")
    print(f"events and transcript:                {jsonl}")
    print(f"what the caller heard:                {out / 'caller-heard.wav'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0
