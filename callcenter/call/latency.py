"""Per-turn latencies from a call's events: what the supervisor floor shows and `bench call` reports."""

from __future__ import annotations

from callcenter.call import events as ev

STAGES = ("endpoint", "stt", "flow", "wait", "tts", "transport")


def turn_latencies(events: list[dict]) -> list[dict]:
    """Stage-by-stage latency (seconds) of each spoken caller turn that the agent answered."""
    turns: dict[int, dict] = {}
    for e in events:
        t = turns.setdefault(e["turn"], {})
        if e["kind"] not in t:
            t[e["kind"]] = e
    out = []
    for n, t in sorted(turns.items()):
        need = (ev.SPEECH_END, ev.STT_FINAL, ev.FLOW_DECISION, ev.TTS_FIRST_AUDIO, ev.FIRST_RTP_OUT)
        if n == 0 or not all(k in t for k in need):
            continue
        end = t[ev.SPEECH_END]
        voice_end = end.get("last_voice_t", end["t"])
        out.append({
            "turn": n,
            "at": end["wall"] - (end["t"] - voice_end),  # when the caller stopped speaking (Unix time)
            "endpoint": end["t"] - voice_end,
            "stt": t[ev.STT_FINAL]["t"] - end["t"],
            "flow": t[ev.FLOW_DECISION]["t"] - t[ev.STT_FINAL]["t"],
            # webhook or model time before the first words (0 for scripted nodes)
            "wait": t[ev.AGENT_SAY]["t"] - t[ev.FLOW_DECISION]["t"] if ev.AGENT_SAY in t else 0.0,
            "tts": t[ev.TTS_FIRST_AUDIO]["t"] - t.get(ev.AGENT_SAY, t[ev.FLOW_DECISION])["t"],
            "transport": t[ev.FIRST_RTP_OUT]["t"] - t[ev.TTS_FIRST_AUDIO]["t"],
            "after_endpoint": t[ev.FIRST_RTP_OUT]["t"] - end["t"],
            "voice_to_voice": t[ev.FIRST_RTP_OUT]["t"] - voice_end,
            # to the reply's first frame with sound in it: what the caller hears (a reply that
            # opens with silence reaches them this much later than its first frame)
            **({"voice_to_sound": t[ev.FIRST_SOUND_OUT]["t"] - voice_end} if ev.FIRST_SOUND_OUT in t else {}),
        })
    return out
