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
