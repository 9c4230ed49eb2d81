"""Browser callers over WebRTC: the resampler and codec plumbing exactly, then real calls on loopback
from a Python aiortc peer (the same offer/answer, data channel and codecs as the /call page) to a
running agent: speech understood, the answer heard (transcribed), keypad digits, barge-in, Opus,
the busy cap, bad offers, hang-up from either side, and a transfer relayed to a SIP phone."""

import asyncio
import json
import os
import shutil
import subprocess
import urllib.request

import numpy as np
import pytest

from callcenter.audio.frames import FRAME_SAMPLES, SAMPLE_RATE
from callcenter.audio.resample import Resampler
from callcenter.call.events import read_events
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.softphone import caller_audio
from callcenter.telephony.webrtc import CallerAudio, WebRtcError, negotiated_codec, use_host_candidates
from tests.conftest import FLOW, free_tcp_port, free_udp_port, rtp_base, wait_for

aiortc = pytest.importorskip("aiortc")
from callcenter.lab.browser_caller import BrowserCaller, BrowserCallError  # noqa: E402

OPUS_RATE = 48000


def tone(freq: float, seconds: float, rate: int, amplitude: float = 8000.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))


# ---------------------------------------------------------------- the edge, exactly

def test_resampler_gives_one_frame_per_frame_and_keeps_the_voice_band():
    down = Resampler(OPUS_RATE, SAMPLE_RATE)
    x = tone(1000, 1.0, OPUS_RATE)
    chunks = [down.process(x[i:i + 960]) for i in range(0, len(x), 960)]
    assert {len(c) for c in chunks} == {FRAME_SAMPLES}  # 20 ms in, 20 ms out, every time (no blocks)
    y = np.concatenate(chunks)
    assert abs(20 * np.log10(rms(y[80:]) / rms(x))) < 0.5
    # the same signal in one piece: chunking changes nothing (the filter state carries over)
    assert np.array_equal(y, Resampler(OPUS_RATE, SAMPLE_RATE).process(x))
    # above the line's band (6 kHz would alias to 2 kHz): removed
    assert rms(Resampler(OPUS_RATE, SAMPLE_RATE).process(tone(6000, 1.0, OPUS_RATE))[80:]) < rms(x) / 100
    up = Resampler(SAMPLE_RATE, OPUS_RATE)
    z = np.concatenate([up.process(c) for c in np.split(tone(1000, 1.0, SAMPLE_RATE), 50)])
    assert len(z) == OPUS_RATE and abs(20 * np.log10(rms(z[480:]) / rms(tone(1000, 1.0, SAMPLE_RATE)))) < 0.5
    assert up.delay_s < 0.002
    with pytest.raises(ValueError, match="integer ratio"):
        Resampler(44100, SAMPLE_RATE)


def _av_frame(samples: np.ndarray, layout: str, rate: int):
    import av

    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout=layout)
    frame.sample_rate = rate
    return frame


def test_caller_audio_makes_line_frames_from_pcmu_and_opus_frames():
    pcmu = CallerAudio()
    x = tone(440, 0.1, SAMPLE_RATE)
    out = [f for i in range(0, len(x), 240) for f in pcmu.push(_av_frame(x[i:i + 240], "mono", SAMPLE_RATE))]
    assert [len(f) for f in out] == [FRAME_SAMPLES * 2] * 5 and b"".join(out) == x.tobytes()
    opus = CallerAudio()
    s = tone(440, 0.2, OPUS_RATE)
    stereo = np.repeat(s, 2)  # packed left/right
    out = [f for i in range(0, len(stereo), 1920) for f in opus.push(_av_frame(stereo[i:i + 1920], "stereo", OPUS_RATE))]
    assert len(out) == 10 and all(len(f) == FRAME_SAMPLES * 2 for f in out)
    y = np.frombuffer(b"".join(out), dtype=np.int16)
    assert abs(20 * np.log10(rms(y[80:]) / rms(s))) < 0.5


ANSWER_PCMU = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0 111\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:111 opus/48000/2\r\n"
ANSWER_OPUS = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\na=rtpmap:111 opus/48000/2\r\n"


def test_negotiated_codec_is_the_answers_first_payload():
    assert negotiated_codec(ANSWER_PCMU) == ("PCMU", 8000)
    assert negotiated_codec(ANSWER_OPUS) == ("opus", 48000)
    assert negotiated_codec("m=audio 9 RTP/AVP 8\r\n") == ("PCMA", 8000)
    with pytest.raises(WebRtcError):
        negotiated_codec("v=0\r\nm=video 9 RTP/AVP 96\r\n")


def test_webrtc_config_and_worker_ports(tmp_path):
    from callcenter.telephony.config import load_server_config
    from callcenter.workers import worker_configs

    cfg = load_server_config("sip_configs/local.yaml")
    assert cfg.webrtc is not None and cfg.webrtc.port == 8480 and cfg.webrtc.max_calls == 2
    ports = [c.webrtc.port for _, c in worker_configs(cfg, 3, tmp_path)]
    assert ports == [8480, 8481, 8482]
    # the recognizer's decode threads: the cores shared among the workers, unless the config says
    cores = len(os.sched_getaffinity(0))
    assert {c.decode_threads for _, c in worker_configs(cfg, 3, tmp_path)} == {max(1, min(4, cores // 3))}
    two = cfg.model_copy(update={"decode_threads": 2})
    assert {c.decode_threads for _, c in worker_configs(two, 3, tmp_path)} == {2}
    bad = tmp_path / "bad.yaml"
    bad.write_text("webrtc:\n  candidates: [my-laptop]\n")
    with pytest.raises(Exception, match=r"bad.yaml:2.*candidates"):
        load_server_config(bad)


# ---------------------------------------------------------------- live calls

@pytest.fixture(scope="module", autouse=True)
def loopback_candidates():
    use_host_candidates(["127.0.0.1"])  # aioice skips loopback by default; the test's peer offers it


def start_agent(tmp_path, flow=FLOW, max_calls=4, control=False):
    return AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), flow, webrtc_port=free_tcp_port(),
                        webrtc_max_calls=max_calls, control_port=free_tcp_port() if control else None,
                        token="t0ken" if control else None).start()




def events_of(agent) -> list[dict]:
    calls = agent.calls()
    return read_events(calls[-1]) if calls else []


def ended(agent) -> bool:
    ev = events_of(agent)
    return bool(ev) and ev[-1]["kind"] == "call_end"


def transcribe(stt, pcm: bytes, start_s: float, end_s: float | None = None) -> str:
    a = int(start_s * SAMPLE_RATE) * 2
    b = int(end_s * SAMPLE_RATE) * 2 if end_s is not None else len(pcm)
    return stt.transcribe_pcm(pcm[a:b]).text.lower()


@pytest.mark.slow
def test_browser_call_speech_barge_in_keypad_and_agent_hang_up(tmp_path, caller_voice, stt):
    # the caller speaks over the menu prompt (barge-in), hears the billing answer, then presses 2
    # ("nothing else") on the keypad and the agent says goodbye and hangs up
    mic = caller_audio([caller_voice("bill", "I have a question about my bill")], tmp_path / "mic.wav",
                       lead_s=4.5, gap_s=0, tail_s=1)
    agent = start_agent(tmp_path, control=True)
    try:
        async def call():
            caller = await BrowserCaller(agent.webrtc_url, mic).call()
            req = urllib.request.Request(agent.control_url + "/api/calls", headers={"Authorization": "Bearer t0ken"})
            reply = await asyncio.get_running_loop().run_in_executor(
                None, lambda: urllib.request.urlopen(req, timeout=5).read())
            rows = json.loads(reply)
            rows = rows["calls"] if isinstance(rows, dict) else rows
            await asyncio.get_running_loop().run_in_executor(
                None, wait_for, lambda: any(e["kind"] == "playout_done" and e.get("utterance", 0) >= 3
                                            for e in events_of(agent)), 30)
            await asyncio.sleep(2.5)  # "Is there anything else…" is playing
            await caller.press("2")
            await asyncio.wait_for(caller.ended.wait(), 20)
            await caller.close()
            return caller, rows

        caller, rows = asyncio.run(call())
        assert caller.codec == "PCMU"
        assert rows and rows[0]["transport"] == "webrtc" and rows[0]["caller"] == "webrtc:127.0.0.1"
        assert caller.bye_by == "agent"
        assert wait_for(lambda: ended(agent), 10), agent.log()[-2000:]
        events = events_of(agent)
        kinds = [e["kind"] for e in events]
        assert events[0]["transport"] == "webrtc"
        assert "barge_in" in kinds, kinds
        assert any(e["kind"] == "stt_final" and "bill" in e["text"].lower() for e in events)
        assert [e.get("intent") for e in events if e["kind"] == "flow_decision"][:2] == ["billing", "done"]
        keys = [(e["digit"], e["source"]) for e in events if e["kind"] == "dtmf"]
        assert keys == [("2", "datachannel")]
        assert events[-1]["ended_by"] == "agent"
        # what the browser heard: the billing answer, then goodbye
        heard = bytes(caller.heard)
        assert "online account" in transcribe(stt, heard, 6, None) or "billing" in transcribe(stt, heard, 6, None)
        assert "goodbye" in transcribe(stt, heard, caller.heard_seconds() - 5).replace(" ", "")
        # the recording holds both sides, as for a phone line
        wav = agent.calls()[-1].with_suffix(".wav")
        assert wav.stat().st_size > 10 * SAMPLE_RATE * 4
    finally:
        agent.stop()


@pytest.mark.slow
def test_opus_busy_cap_bad_offers_and_caller_hang_up(tmp_path, stt):
    agent = start_agent(tmp_path, max_calls=1)
    try:
        async def calls():
            first = await BrowserCaller(agent.webrtc_url, codecs=("audio/opus",)).call()
            with pytest.raises(BrowserCallError) as busy:  # the cap is one browser call
                await BrowserCaller(agent.webrtc_url).call()
            import aiohttp

            async with aiohttp.ClientSession() as http:
                async with http.post(agent.webrtc_url + "/call/offer", data=b"not json") as r:
                    bad_json = (r.status, await r.json())
                async with http.post(agent.webrtc_url + "/call/offer", json={"sdp": "v=0\r\nm=video 9 RTP/AVP 96\r\n",
                                                                            "type": "offer"}) as r:
                    no_audio = r.status
                async with http.get(agent.webrtc_url + "/call") as r:
                    page = await r.text()
            first.send_raw("{broken")
            first.send_raw(json.dumps({"type": "key", "key": "55"}))
            first.send_raw(json.dumps({"type": "key", "key": "x"}))
            await asyncio.sleep(4.0)  # the greeting, over Opus
            await first.hangup()
            return first, busy.value, bad_json, no_audio, page

        first, busy, bad_json, no_audio, page = asyncio.run(calls())
        assert first.codec == "opus"
        assert busy.status == 503 and busy.error == "busy" and "busy" in busy.message
        assert bad_json[0] == 400 and bad_json[1]["error"] == "bad_request"
        assert no_audio == 400
        assert 'id="keypad"' in page and "/call/offer" in page
        assert "thank you for calling" in transcribe(stt, bytes(first.heard), 0, 3.5)
        assert wait_for(lambda: ended(agent), 10)
        events = events_of(agent)
        assert events[-1]["ended_by"] == "caller"
        assert not [e for e in events if e["kind"] == "dtmf"]  # the malformed keys were refused
        assert "webrtc_bad_key" in agent.log() and "webrtc_bad_message" in agent.log()

        async def again():  # the slot is free again
            c = await BrowserCaller(agent.webrtc_url).call()
            await asyncio.sleep(1)
            await c.hangup()
            return c

        assert asyncio.run(again()).codec == "PCMU"
        assert wait_for(lambda: len(agent.calls()) == 2 and ended(agent), 10)
        assert agent.proc.poll() is None
    finally:
        agent.stop()


@pytest.mark.slow
@pytest.mark.sip
@pytest.mark.skipif(not shutil.which("sipp"), reason="sipp is needed as the person's phone")
def test_transfer_from_a_browser_relays_to_the_persons_phone(tmp_path, caller_voice, stt):
    # press 0 for an operator: a browser cannot be REFERred, so the agent calls the person (a sipp
    # phone that echoes) and relays; the caller hearing their own words back proves the relay
    port = free_udp_port()
    person = subprocess.Popen(
        ["sipp", "-sn", "uas", "-i", "127.0.0.1", "-p", str(port), "-m", "1", "-rtp_echo", "-timeout", "60",
         "-nostdin"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    flow = tmp_path / "flow.yaml"
    flow.write_text(FLOW.read_text().replace("sip:operator@127.0.0.1:5099", f"sip:operator@127.0.0.1:{port}"))
    mic = caller_audio([caller_voice("numbers", "testing one two three four five")], tmp_path / "mic.wav",
                       lead_s=11, gap_s=0, tail_s=4)
    agent = start_agent(tmp_path, flow=flow)
    try:
        async def call():
            caller = await BrowserCaller(agent.webrtc_url, mic).call()
            await asyncio.sleep(1.0)
            await caller.press("0")
            await asyncio.sleep(16)
            await caller.hangup()
            return caller

        caller = asyncio.run(call())
        assert wait_for(lambda: ended(agent), 10)
        events = events_of(agent)
        done = [e for e in events if e["kind"] == "transfer" and "accepted" in e]
        assert done and done[0]["accepted"] is True, [e["kind"] for e in events]
        heard = transcribe(stt, bytes(caller.heard), 11.5)
        # Whisper writes the counting either as words or as digits ("1, 2, 3, 4, 5.")
        assert any(w in heard.lower() for w in ("testing", "three", "four", "five", "3", "4", "5")), heard
        assert events[-1]["ended_by"] == "transfer"
        assert person.wait(15) == 0  # the caller hung up: the agent hung up the person's leg too
    finally:
        agent.stop()
        if person.poll() is None:
            person.kill()
