"""A Speech's opening silence on the line: the voices open every sentence with about 0.3 s of
silence, which is the pause between sentences said back to back, and dead air before a reply."""

import asyncio
import math

import numpy as np

from callcenter.audio.frames import FRAME_SAMPLES, AudioFrame, float_to_pcm
from callcenter.call.speech import MIN_LEAD_MS, shorten_lead_in

SILENT = AudioFrame(bytes(2 * FRAME_SAMPLES))
FAINT = AudioFrame(float_to_pcm(np.full(FRAME_SAMPLES, 10 ** (-75 / 20), np.float32)))  # -75 dBFS
VOICED = AudioFrame(float_to_pcm(0.1 * np.sin(np.arange(FRAME_SAMPLES) * 0.3).astype(np.float32)))


def passed(frames, quiet_s):
    async def source():
        for f in frames:
            yield f

    async def collect():
        return [f async for f in shorten_lead_in(source(), quiet_s)]

    return asyncio.run(collect())


def test_after_a_quiet_line_the_reply_starts_at_once():
    speech = [SILENT] * 10 + [FAINT] * 7 + [VOICED] * 5 + [SILENT] * 3 + [VOICED] * 2
    out = passed(speech, math.inf)
    lead = MIN_LEAD_MS // 20
    assert out == [FAINT] * lead + [VOICED] * 5 + [SILENT] * 3 + [VOICED] * 2  # silence inside is kept


def test_between_sentences_said_back_to_back_the_pause_is_kept():
    speech = [SILENT] * 17 + [VOICED] * 5
    assert passed(speech, 0.0) == speech
    assert passed(speech, 0.015) == speech  # less than a frame of silence on the line


def test_the_silence_already_on_the_line_counts_towards_the_pause():
    speech = [SILENT] * 17 + [VOICED] * 5
    assert passed(speech, 0.2) == [SILENT] * 7 + [VOICED] * 5  # 10 frames were already quiet
    assert passed(speech, 1.0) == [SILENT] * (MIN_LEAD_MS // 20) + [VOICED] * 5


def test_a_speech_of_silence_alone_is_passed_on_whole():
    assert passed([SILENT] * 6, math.inf) == [SILENT] * 6
    assert passed([], math.inf) == []


def test_the_voice_behind_it_is_closed_when_the_listener_stops():
    closed = []

    async def source():
        try:
            for f in [SILENT] * 3 + [VOICED] * 50:
                yield f
        finally:
            closed.append(True)

    async def first_two():
        gen = shorten_lead_in(source(), math.inf)
        out = [await gen.__anext__(), await gen.__anext__()]
        await gen.aclose()  # a barge-in
        return out

    assert len(asyncio.run(first_two())) == 2 and closed == [True]
