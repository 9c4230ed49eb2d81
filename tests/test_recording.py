import os
import wave

import numpy as np

from callcenter.audio.frames import FRAME_BYTES
from callcenter.call.events import CallEvents, read_events
from callcenter.call.recording import FLUSH_FRAMES, HEADER_REFRESH_FRAMES, StereoRecorder, repair_recordings, repair_wav


def frame(value: int) -> bytes:
    return np.full(FRAME_BYTES // 2, value, dtype="<i2").tobytes()


def test_stereo_recording_is_time_aligned(tmp_path):
    rec = StereoRecorder(tmp_path / "c.wav")
    for i in range(10):
        rec.write(frame(i), frame(-i))
    rec.close()
    with wave.open(str(tmp_path / "c.wav")) as w:
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (2, 8000, 2)
        data = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    assert len(data) == 1600
    assert (data[160 * 3 : 160 * 4, 0] == 3).all() and (data[160 * 3 : 160 * 4, 1] == -3).all()


def test_unclosed_recording_is_readable_and_repairable(tmp_path):
    path = tmp_path / "2026-01-01" / "killed.wav"
    rec = StereoRecorder(path)
    n = HEADER_REFRESH_FRAMES * 2 + 17
    for i in range(n):
        rec.write(frame(1), frame(2))
    os.close(rec._fd)  # the process dies: no close(), no final header
    with wave.open(str(path)) as w:  # playable as it is, up to the last header refresh
        assert w.getnframes() == HEADER_REFRESH_FRAMES * 2 * 160
    assert repair_recordings(tmp_path) == [path]
    with wave.open(str(path)) as w:  # all but the last 200 ms (not yet flushed when it died)
        assert w.getnframes() == (n - n % FLUSH_FRAMES) * 160
    assert repair_wav(path) is False  # nothing left to fix


def test_repair_ignores_non_wav(tmp_path):
    p = tmp_path / "x.wav"
    p.write_bytes(b"garbage" * 20)
    assert repair_wav(p) is False


def test_events_survive_a_cut_last_line(tmp_path):
    ev = CallEvents("c1", tmp_path / "e.jsonl")
    ev.emit("call_start", flow="f")
    ev.emit("agent_say", text="hello")
    ev.close()
    with open(tmp_path / "e.jsonl", "a") as f:
        f.write('{"kind": "stt_fi')  # killed mid-write
    kinds = [e["kind"] for e in read_events(tmp_path / "e.jsonl")]
    assert kinds == ["call_start", "agent_say"]
