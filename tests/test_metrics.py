"""The Prometheus exposition of callcenter/metrics.py, read back by prometheus_client's parser."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from callcenter.call import events as ev
from callcenter.call.call_metrics import CallMetrics
from callcenter.metrics import Counter, Gauge, Histogram, Registry


def parse(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_counters_gauges_and_histograms_parse_back():
    r = Registry()
    c = r.add(Counter("x_total", "Things.", ("kind",)))
    c.inc(kind='a "quoted"\nname\\')
    c.inc(2, kind="b")
    r.add(Gauge("g", "A reading.", lambda: 2.5))
    h = r.add(Histogram("h_seconds", "Times.", (0.1, 1.0), ("stage",)))
    for v in (0.05, 0.1, 0.5, 7.0):
        h.observe(v, stage="stt")
    got = parse(r.render())
    assert got["x_total"] == {(("kind", 'a "quoted"\nname\\'),): 1.0, (("kind", "b"),): 2.0}
    assert got["g"] == {(): 2.5}
    buckets = got["h_seconds_bucket"]
    assert [buckets[(("le", le), ("stage", "stt"))] for le in ("0.1", "1.0", "+Inf")] == [2, 3, 4]  # cumulative
    assert got["h_seconds_count"][(("stage", "stt"),)] == 4
    assert got["h_seconds_sum"][(("stage", "stt"),)] == pytest.approx(7.65)


def test_misuse_is_refused():
    r = Registry()
    c = r.add(Counter("x_total", "Things.", ("kind",)))
    with pytest.raises(ValueError):
        c.inc(-1, kind="a")
    with pytest.raises(ValueError):
        c.inc(other="a")
    with pytest.raises(ValueError):
        r.add(Counter("x_total", "again"))


def test_a_calls_events_become_turn_latencies_and_faults():
    m = CallMetrics(lambda: {("sip",): 1}, lambda: {("sip", "max_calls"): 3})
    t = [0.0]
    events = ev.CallEvents("c1", clock=lambda: t[0])
    m.watch(events, "sip")

    def at(s, kind, **data):
        t[0] = s
        events.emit(kind, **data)

    for turn, start in ((1, 10.0), (2, 20.0)):
        events.next_turn()
        at(start, ev.SPEECH_END, last_voice_t=start - 0.3)
        at(start + 0.01, ev.STT_FINAL, text="billing")
        at(start + 0.02, ev.FLOW_DECISION, intent="billing")
        at(start + 0.03, ev.AGENT_SAY, text="Sure.")
        at(start + 0.08, ev.TTS_FIRST_AUDIO)
        at(start + 0.09, ev.FIRST_RTP_OUT)
    events.next_turn()
    at(30.0, ev.SPEECH_END)  # never answered: no latency
    at(31.0, ev.STAGE_SLOW, stage="stt")
    at(32.0, ev.MEDIA, frames_out=1600, late_frames=2)
    got = parse(m.render())
    assert got["callcenter_calls_total"] == {(("transport", "sip"),): 1}
    assert got["callcenter_turns_total"] == {(): 2}
    v2v = got["callcenter_turn_stage_seconds_sum"][(("stage", "voice_to_voice"),)]
    assert v2v == pytest.approx(2 * 0.39)
    assert got["callcenter_turn_stage_seconds_count"][(("stage", "endpoint"),)] == 2
    assert got["callcenter_stage_faults_total"] == {(("kind", "stage_slow"),): 1}
    assert got["callcenter_frames_sent_total"][()] == 1600 and got["callcenter_frames_late_total"][()] == 2
    assert got["callcenter_calls_rejected_total"] == {(("reason", "max_calls"), ("transport", "sip")): 3}
