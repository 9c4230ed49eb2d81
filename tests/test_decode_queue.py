"""The process's Whisper decodes under many calls (hearing/stt.py DecodeQueue): stale partials are
dropped, the decode a caller waits for goes first, no more than `workers` run at once."""

import threading
import time
from concurrent.futures import CancelledError

import pytest

from callcenter.hearing import stt as stt_module
from callcenter.hearing.stt import DecodeQueue, decode_queue


class Recorder:
    """A recognizer that records the order it is asked in; `gate` holds each decode until set."""

    def __init__(self):
        self.order: list[bytes] = []
        self.gate = threading.Event()
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def transcribe_pcm(self, pcm, rate=8000, hint=None):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.gate.wait(5)
        with self.lock:
            self.order.append(pcm)
            self.running -= 1
        if pcm == b"boom":
            raise RuntimeError("recognizer crashed")
        return pcm.decode() + (f"|{hint}" if hint else "")


def hold_the_only_decoder(queue: DecodeQueue, rec: Recorder):
    """Occupy the single worker so that everything submitted next waits."""
    first = queue.submit(("busy", 0), b"busy")
    deadline = time.monotonic() + 2
    while rec.running == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    return first


def test_a_newer_pause_of_the_same_turn_drops_the_waiting_decode():
    rec = Recorder()
    queue = DecodeQueue(rec.transcribe_pcm, workers=1)
    hold_the_only_decoder(queue, rec)
    old = queue.submit(("call", 1), b"I have")
    other_call = queue.submit(("other", 1), b"hello")
    new = queue.submit(("call", 1), b"I have a question", hint="billing")
    assert old.cancelled() and not other_call.cancelled()
    rec.gate.set()
    assert new.result(5) == "I have a question|billing" and other_call.result(5) == "hello"
    with pytest.raises(CancelledError):
        old.result(0)
    assert b"I have" not in rec.order and queue.dropped == 1


def test_the_decode_a_caller_waits_for_goes_first():
    rec = Recorder()
    queue = DecodeQueue(rec.transcribe_pcm, workers=1)
    hold_the_only_decoder(queue, rec)
    futures = [queue.submit(("a", 1), b"a partial"), queue.submit(("b", 1), b"b partial"),
               queue.submit(("c", 1), b"c ended", urgent=True), queue.submit(("d", 1), b"d partial")]
    queue.hurry(("b", 1))  # b's caller stopped talking: its waiting decode is now urgent
    rec.gate.set()
    for f in futures:
        f.result(5)
    # urgent ones in arrival order (b was submitted before c), then the speculative ones
    assert rec.order == [b"busy", b"b partial", b"c ended", b"a partial", b"d partial"]


def test_no_more_than_workers_decode_at_once_and_errors_reach_the_caller():
    rec = Recorder()
    queue = DecodeQueue(rec.transcribe_pcm, workers=2)
    futures = [queue.submit((f"call{i}", 1), f"turn {i}".encode()) for i in range(6)]
    broken = queue.submit(("broken", 1), b"boom")
    time.sleep(0.1)
    assert rec.running == 2 and queue.waiting() == 5
    rec.gate.set()
    assert sorted(f.result(5) for f in futures) == [f"turn {i}" for i in range(6)]
    with pytest.raises(RuntimeError, match="crashed"):
        broken.result(5)
    assert rec.most == 2


def test_idle_decoders_end_and_come_back(monkeypatch):
    monkeypatch.setattr(stt_module, "DECODER_IDLE_S", 0.05)
    rec = Recorder()
    rec.gate.set()
    queue = DecodeQueue(rec.transcribe_pcm, workers=2)
    assert queue.submit(("a", 1), b"one").result(5) == "one"
    deadline = time.monotonic() + 2
    while queue._threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert queue._threads == []
    assert queue.submit(("a", 2), b"two").result(5) == "two"


def test_one_queue_per_recognizer():
    a, b = Recorder(), Recorder()
    assert decode_queue(a) is decode_queue(a) and decode_queue(a) is not decode_queue(b)
