"""The agent's voice on the line: each sentence synthesised (or a recorded prompt played) into the
media bridge, with a backup engine when the voice fails or stalls, its lead-in silence shortened by
the quiet already on the line, and its playout timed. `interrupt()` is barge-in: synthesis
cancelled, queued sentences and queued audio dropped at once."""

from __future__ import annotations

import asyncio
import contextlib
import math

from callcenter.audio.frames import frames_from_pcm
from callcenter.call import events as ev
from callcenter.call.speech import Speech, shorten_lead_in
from callcenter.dialog.flow import RECORDED

TTS_FIRST_AUDIO_S = 0.8  # a voice with no first frame by then (or none for this long between frames)
TTS_FRAME_GAP_S = 1.0  # has stalled: the backup voice says the sentence
BACKUP_VOICE = "espeak:en-us"  # another engine entirely (espeak-ng), not another SSM voice


async def unless_stalled(items, first_s: float, gap_s: float):
    """Yield from the async iterator `items`; TimeoutError if the first item takes longer than
    `first_s` or a later one longer than `gap_s`. `items` is closed however this ends.

    asyncio.timeout, not wait_for: Python 3.11's wait_for returns the item when a cancel arrives
    just as the item does, which would let a voice outlive a barge-in or the call itself."""
    wait = first_s
    try:
        while True:
            try:
                async with asyncio.timeout(wait):
                    item = await anext(items)
            except StopAsyncIteration:
                return
            yield item
            wait = gap_s
    finally:
        with contextlib.suppress(Exception):
            await items.aclose()


async def recorded_frames(pcm: bytes, burst: int = 50):
    """A recorded prompt's 20 ms frames, handed over in bursts as a cached sentence is."""
    for i, frame in enumerate(frames_from_pcm(pcm)):
        yield frame
        if i % burst == burst - 1:
            await asyncio.sleep(0)


_BACKUP_SPEAKER = None


def backup_speaker():
    """The voice of last resort, shared by the process's calls: espeak-ng, another engine than the
    flows' SSM voices, so what breaks one is unlikely to break the other."""
    global _BACKUP_SPEAKER
    if _BACKUP_SPEAKER is None:
        from callcenter.voice.speaker import make_tts

        _BACKUP_SPEAKER = make_tts(BACKUP_VOICE)
    return _BACKUP_SPEAKER


class Speaking:
    def __init__(self, call, tts, backup_tts=None):
        self.call = call
        self.tts = tts
        self._backup_tts = backup_tts
        self.queue: asyncio.Queue = asyncio.Queue()  # the flow's actions, carried out in order
        self.spoken = 0  # speech ids given so far
        self.speech: Speech | None = None  # what the agent is saying now
        self._playing: dict[int, Speech] = {}  # speeches whose playout the bridge has not finished
        self._done_at: float | None = None  # when the agent's last Speech left the line (bridge clock)
        self.generation = 0  # bumped by every interruption: streamed model sentences of an older one are dropped
        call.bridge.on_playout(self._first_frame_out, self._utterance_played, self._first_sound_out)

    @property
    def speaking(self) -> bool:
        return self.speech is not None or not self.queue.empty() or self.call.bridge.queued_frames > 0

    @property
    def backup_tts(self):
        if self._backup_tts is None:
            self._backup_tts = backup_speaker()
        return self._backup_tts

    def interrupt(self, reason: str, emit: bool = True) -> None:
        """Stop the agent's voice now: cancel synthesis, drop queued prompts and queued audio."""
        bridge = self.call.bridge
        self.generation += 1
        dropped = bridge.flush()
        bridge.resume()
        while not self.queue.empty():
            self.queue.get_nowait()
        if self.speech is not None:
            self.speech.interrupt()
            self._utterance_played(self.speech.id, bridge.clock())
        if emit:
            self.call.events.emit(ev.BARGE_IN, reason=reason, dropped_frames=dropped)

    def new_speech(self, text: str = "", voice=None, private: bool = False) -> Speech:
        self.spoken += 1
        speech = Speech(self.spoken, text, voice, private)
        self._playing[speech.id] = speech
        return speech

    async def say(self, text: str, voice=None, private: bool = False, audio: str | None = None) -> None:
        call = self.call
        speech = self.speech = self.new_speech(text, voice or call.flow.voice, private)
        speech.audio = audio
        call.events.emit(ev.AGENT_SAY, text=text, utterance=speech.id, voice=speech.voice.name)
        call.hearing.listener.agent_saying(text)
        speech.synthesis = asyncio.create_task(self._synthesise(speech))
        try:
            await speech.synthesis
        except asyncio.CancelledError:
            if call.ended.is_set():
                raise
        except Exception as exc:
            call.log.error("tts_failed", error=str(exc))
            call.events.emit(ev.ERROR, stage="tts", error=str(exc))
            call.bridge.end_utterance(speech.id)
        await speech.played
        self.speech = None

    async def _synthesise(self, speech: Speech) -> None:
        """A private speech says a sensitive value in full; it is synthesised for this call alone
        (never cached) and recorded as silence."""
        call = self.call
        text, utt, voice, private = speech.text, speech.id, speech.voice, speech.private
        try:
            if speech.audio is not None and speech.audio in RECORDED:  # a voice talent's recording
                frames = recorded_frames(RECORDED[speech.audio])
            elif private:
                frames = self.tts.stream(text, voice, cache=False)
            else:
                frames = self.tts.stream(text, voice)
            await self._voice_into(frames, utt, private)
        except Exception as exc:  # the voice raised or stalled: the backup engine says the sentence
            error = str(exc) or f"no audio within {TTS_FIRST_AUDIO_S} s"
            call.log.error("tts_failed", error=error, fallback=BACKUP_VOICE)
            call.events.emit(ev.ERROR, stage="tts", error=error)
            call.events.emit(ev.STAGE_FALLBACK, stage="tts", to=BACKUP_VOICE)
            await self._voice_into(self.backup_tts.stream(text), utt, private)
        call.bridge.end_utterance(utt)

    async def _voice_into(self, frames, utt: int, private: bool = False) -> None:
        """Queue a voice's frames for playout, its opening silence shortened by the silence already
        on the line (`shorten_lead_in`); TimeoutError if it stalls (first frame, or a gap)."""
        bridge = self.call.bridge
        first = True
        quiet_s = math.inf if self._done_at is None else max(0.0, bridge.clock() - self._done_at)
        frames = shorten_lead_in(unless_stalled(frames, TTS_FIRST_AUDIO_S, TTS_FRAME_GAP_S), quiet_s)
        async with contextlib.aclosing(frames) as voiced:
            async for frame in voiced:
                if first:
                    self.call.events.emit(ev.TTS_FIRST_AUDIO, utterance=utt)
                bridge.play(frame, utt, first=first, private=private)
                first = False

    def _first_frame_out(self, utt: int, at: float) -> None:
        self.call.events.emit_at(ev.FIRST_RTP_OUT, self.call.events.since_start(at), utterance=utt)

    def _first_sound_out(self, utt: int, at: float) -> None:
        self.call.events.emit_at(ev.FIRST_SOUND_OUT, self.call.events.since_start(at), utterance=utt)

    def _utterance_played(self, utt: int, at: float) -> None:
        self._done_at = at
        speech = self._playing.pop(utt, None)
        if speech is not None and speech.finish():
            self.call.events.emit(ev.PLAYOUT_DONE, utterance=utt)

    async def brief(self, bridge, text: str) -> None:
        """Speak `text` into another leg (the person a warm transfer goes to) and wait until it has
        been played out."""
        self.call.events.emit(ev.TRANSFER_SUMMARY, text=text)
        played = asyncio.get_running_loop().create_future()
        bridge.on_playout(lambda utt, at: None, lambda utt, at: played.done() or played.set_result(at))
        first = True
        async for frame in self.tts.stream(text, self.call.flow.voice):
            bridge.play(frame, 1, first=first)
            first = False
        bridge.end_utterance(1)
        await played  # the leg's own playout says when its last frame has gone
