"""The /call page in a real browser: headless Chromium (Debian's), driven by Playwright, with a WAV
file as its microphone. The call connects, the agent's greeting arrives as decoded audio, the on-screen
keypad reaches the flow (over the data channel), hang-up ends the call on the agent. A screenshot of
the page in the call is kept in tests/artifacts/."""

import time
from pathlib import Path

import pytest

from callcenter.call.events import read_events
from callcenter.lab.agent_process import AgentProcess
from callcenter.lab.softphone import caller_audio
from tests.conftest import FLOW, free_tcp_port, free_udp_port, rtp_base, wait_for

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"

pytestmark = [pytest.mark.slow]

if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is needed (scripts/setup installs it)", allow_module_level=True)
playwright = pytest.importorskip("playwright.sync_api")




def chromium_args(mic: Path) -> list[str]:
    return [
        "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-quic",
        # this machine's network is closed: no background fetches, no component updates
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={mic}%noloop",
        "--autoplay-policy=no-user-gesture-required",
        "--allow-loopback-in-peer-connection",  # tests stay on 127.0.0.1
    ]


AUDIO_ENERGY_JS = """async () => {
  const pc = window.callState.pc;
  if (!pc) return -1;
  let energy = 0;
  (await pc.getStats()).forEach((r) => { if (r.type === "inbound-rtp" && r.kind === "audio") energy = r.totalAudioEnergy || 0; });
  return energy;
}"""


def test_call_page_in_headless_chromium(tmp_path):
    mic = caller_audio([], tmp_path / "mic.wav", lead_s=60, gap_s=0, tail_s=0)  # a quiet room
    agent = AgentProcess(tmp_path / "agent", free_udp_port(), rtp_base(), FLOW, webrtc_port=free_tcp_port()).start()

    def events() -> list[dict]:
        calls = agent.calls()
        return read_events(calls[-1]) if calls else []

    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium_args(mic))
            page = browser.new_page(viewport={"width": 420, "height": 640})
            page.goto(agent.webrtc_url + "/call")
            assert page.inner_text("h1") == "Call us"
            assert page.is_disabled("#hangup") and page.is_disabled("#keypad button[data-key='1']")
            page.click("#call")
            page.wait_for_function("document.body.dataset.phase === 'connected'", timeout=15000)
            assert page.inner_text("#status") == "Connected"
            # the greeting and the menu prompt arrive as audio the browser decodes
            assert wait_for(lambda: any(e["kind"] == "agent_say" and e.get("utterance") == 2 for e in events()), 15)
            time.sleep(1.0)
            assert page.evaluate(AUDIO_ENERGY_JS) > 0.01
            page.click("#keypad button[data-key='1']")  # billing, over the menu prompt
            assert wait_for(lambda: any(e["kind"] == "flow_decision" and e.get("intent") == "billing"
                                        for e in events()), 10), [e["kind"] for e in events()]
            assert page.inner_text("#keys") == "1"
            time.sleep(1.0)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "call-page.png"))
            page.click("#hangup")
            page.wait_for_function("document.body.dataset.phase === 'ended'", timeout=5000)
            assert page.inner_text("#status") == "You hung up."
            browser.close()
        assert wait_for(lambda: events() and events()[-1]["kind"] == "call_end", 10)
        ev = events()
        assert ev[0]["transport"] == "webrtc"
        assert [(e["digit"], e["source"]) for e in ev if e["kind"] == "dtmf"] == [("1", "datachannel")]
        assert "barge_in" in [e["kind"] for e in ev]
        assert ev[-1]["ended_by"] == "caller"
        assert '"codec": "PCMU"' in agent.log()  # the browser offered Opus first; the agent chose PCMU
    finally:
        agent.stop()
