"""The recognizer's queue: ended turns before pauses before partial looks; cancelled decodes skipped."""

import asyncio
import threading

from callcenter.hearing.decoding import ENDED, PARTIAL, PAUSED, Decode, DecodeExecutor, decode_executor


def test_the_most_urgent_decode_runs_first_and_cancelled_ones_never_run():
    executor = DecodeExecutor(workers=1)
    gate, ran = threading.Event(), []
    executor.submit(gate.wait)  # the one worker is busy
    futures = {name: executor.submit(Decode(priority, ran.append), name)
               for name, priority in [("partial", PARTIAL), ("pause", PAUSED), ("ended", ENDED),
                                      ("stale", PARTIAL), ("ended-2", ENDED)]}
    assert futures["stale"].cancel()
    gate.set()
    for name, f in futures.items():
        if name != "stale":
            f.result(timeout=5)
    assert ran == ["ended", "ended-2", "pause", "partial"]
    assert executor.skipped == 1
    executor.shutdown()


def test_a_later_decode_of_a_turn_replaces_its_queued_one_and_keeps_its_place():
    executor = DecodeExecutor(workers=1)
    gate, ran = threading.Event(), []
    executor.submit(gate.wait)  # the one worker is busy
    first = executor.submit(Decode(PAUSED, ran.append, stream=("a", 1)), "a: I have a question")
    executor.submit(Decode(PAUSED, ran.append, stream=("b", 1)), "b: billing")
    again = executor.submit(Decode(PAUSED, ran.append, stream=("a", 1)), "a: I have a question about")
    partial = executor.submit(Decode(PARTIAL, ran.append, stream=("a", 1)), "a: I have a question about my")
    other_turn = executor.submit(Decode(PARTIAL, ran.append, stream=("a", 2)), "a: next turn")
    urgent = executor.submit(Decode(PARTIAL, ran.append, stream=("c", 1)), "c: partial")
    ended = executor.submit(Decode(ENDED, ran.append, stream=("c", 1)), "c: ended")
    gate.set()
    for f in (partial, other_turn, ended):
        f.result(timeout=5)
    assert first.cancelled() and again.cancelled() and urgent.cancelled()
    # a's latest look runs in a's first place, before b; c's ended decode jumps the queue
    assert ran == ["c: ended", "a: I have a question about my", "b: billing", "a: next turn"]
    assert executor.skipped == executor.replaced == 3
    executor.shutdown()


def test_a_decode_no_longer_wanted_when_its_turn_comes_is_skipped():
    executor = DecodeExecutor(workers=1)
    gate, ran, talking = threading.Event(), [], {"a": False}
    executor.submit(gate.wait)
    stale = executor.submit(Decode(PAUSED, ran.append, wanted=lambda: not talking["a"]), "a paused")
    kept = executor.submit(Decode(PAUSED, ran.append, wanted=lambda: True), "b paused")
    talking["a"] = True  # a went on talking while the recognizer was busy
    gate.set()
    kept.result(timeout=5)
    assert stale.cancelled() and ran == ["b paused"] and executor.skipped == 1
    executor.shutdown()


def test_a_decode_a_caller_now_waits_for_runs_with_the_ended_turns():
    executor = DecodeExecutor(workers=1)
    gate, ran = threading.Event(), []
    executor.submit(gate.wait)
    others = [executor.submit(Decode(PAUSED, ran.append, stream=(c, 1)), f"{c} paused") for c in "bc"]
    waited = executor.submit(Decode(PAUSED, ran.append, stream=("a", 1)), "a settled")
    executor.hurry(("a", 1))  # a's turn ended: a waits for this decode
    executor.hurry(("z", 1))  # nothing queued for it: nothing happens
    gate.set()
    for f in (*others, waited):
        f.result(timeout=5)
    assert ran == ["a settled", "b paused", "c paused"]
    executor.shutdown()


def test_a_decode_that_started_is_not_replaced():
    executor = DecodeExecutor(workers=1)
    started, gate, ran = threading.Event(), threading.Event(), []

    def slow(name):
        started.set()
        gate.wait()
        ran.append(name)

    running = executor.submit(Decode(PAUSED, slow, stream=("a", 1)), "first")
    assert started.wait(5)
    later = executor.submit(Decode(PAUSED, ran.append, stream=("a", 1)), "second")
    gate.set()
    later.result(timeout=5)
    assert running.result(timeout=5) is None and ran == ["first", "second"]
    assert executor.replaced == 0
    executor.shutdown()


def test_an_asyncio_call_awaits_a_decode_and_a_failure_reaches_it():
    executor = DecodeExecutor(workers=2)

    def fail():
        raise RuntimeError("recognizer crashed")

    async def main():
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(executor, Decode(ENDED, lambda x: x * 2), 21) == 42
        try:
            await loop.run_in_executor(executor, Decode(PAUSED, fail))
        except RuntimeError as exc:
            return str(exc)

    assert asyncio.run(main()) == "recognizer crashed"
    executor.shutdown()


def test_calls_sharing_a_recognizer_share_its_queue():
    class Stt:
        workers = 1

    one, other = Stt(), Stt()
    assert decode_executor(one) is decode_executor(one)
    assert decode_executor(one) is not decode_executor(other)


def test_arrival_order_can_be_chosen_to_measure_the_difference(monkeypatch):
    monkeypatch.setenv("CALLCENTER_DECODE_ORDER", "arrival")
    executor = DecodeExecutor(workers=1)
    gate, ran = threading.Event(), []
    executor.submit(gate.wait)
    futures = [executor.submit(Decode(p, ran.append), name) for name, p in [("partial", PARTIAL), ("ended", ENDED)]]
    gate.set()
    for f in futures:
        f.result(timeout=5)
    assert ran == ["partial", "ended"]
    executor.shutdown()
