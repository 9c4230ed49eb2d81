"""The one hearing path of a call, without I/O: line frames and decode results in, typed outcomes out.

`Listener` owns the line front (echo canceller, noise gate), in-band keypad detection, the turn
detector, the bookkeeping of which parts of a turn are being decoded, and the de-duplication of a
key press that arrives both as an RFC 4733 event and as a tone. It never waits, starts a thread or
touches a clock: the live call (`call/session.py`) carries its outcomes out on the event loop, and
the lab's replay drives the very same class on a virtual clock, so the barge-in tests test what
ships. (LiveKit Agents' `RecognitionHooks` sit on the same seam.)

Outcomes, in the order they happened within a frame:
- `Started` (hold the agent's voice if `agent_talking`), `Resume`, `BargeIn` (interrupt),
  `Discarded`: the turn detector's own events;
- `Pause`: decode this much of the turn, then hand the text to `decoded()`; the same part of a
  turn is never asked for twice. A decode the caller of this class does not make (a `recheck` or a
  console look while its recognizer is busy) is handed back with `declined()`. Where the
  expectation has a `finished` judge (a free-speech llm node with the offline model), a pause's
  text is judged too, and the verdict goes to `judged()`;
- `Ended`: the caller's turn is over; `covering(turn)` says which decode already in flight covers
  it (None: decode `turn.pcm` now, unless `turn.text` is already known);
- `Key`: a keypad digit, from the tones in the audio (`frame()`) or from signalling (`key()`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from callcenter.audio.frames import AudioFrame, silence
from callcenter.audio.stage import Moment
from callcenter.hearing.dtmf import InbandDtmf
from callcenter.hearing.front import HearingConfig, LineFront
from callcenter.hearing.turns import Ended, Event, Expectation, Pause, Turn, TurnDetector

DTMF_DEDUP_S = 0.5  # one key press heard both as an RFC 4733 event and as an in-band tone
KEEP_DECODES_OF_TURNS = 2  # decode requests of older turns are forgotten


@dataclass(frozen=True)
class Key:
    digit: str
    source: str  # inband | rfc4733 | webrtc


Outcome = Event | Key


class Listener:
    def __init__(self, config: HearingConfig | None = None):
        self.front = LineFront(config)
        self.config = self.front.config
        self.turns = TurnDetector(self.config.turns)
        self.keypad = InbandDtmf()
        self._requested: set[tuple[int, int]] = set()  # (turn id, frames covered) sent out as Pause
        self._last_key: tuple[str, float, str] | None = None

    # ---------------------------------------------------------------- what the call tells us
    def expecting(self, expect: Expectation) -> None:
        self.turns.expecting(expect)

    def agent_saying(self, text: str) -> None:
        self.turns.agent_saying(text)

    @property
    def expect(self) -> Expectation:
        return self.turns.expect

    @property
    def in_speech(self) -> bool:
        return self.turns.in_speech

    @property
    def floor_db(self) -> float:
        return self.turns.floor_db

    # ---------------------------------------------------------------- inputs
    def process(self, frame: AudioFrame, at: Moment) -> list[Outcome]:
        """One 20 ms line frame: what the caller sent; `at.played` is what the agent sent in the same
        tick, `at.agent_talking` whether its voice is on the line."""
        out: list[Outcome] = []
        for digit in self.keypad.process(frame, at):
            key = self.key(digit, "inband", at.t)
            if key is not None:
                out.append(key)
        if self.keypad.tone_on:  # a keypad tone is not caller speech
            frame = silence()
        at = replace(at, caller_talking=self.turns.in_speech)
        stt_frame, at = self.front.process(frame, at)
        out += self._new(self.turns.process(stt_frame, at))
        return out

    def decoded(self, turn_id: int, key: int, text: str, confidence: float, guessed: bool = False) -> list[Outcome]:
        """The text of a `Pause` decode (`guessed`: see `Transcript.guessed`)."""
        return self._new(self.turns.heard(turn_id, key, text, confidence, guessed))

    def judged(self, turn_id: int, key: int, finished: bool) -> list[Outcome]:
        """Whether the text of a `Pause` decode reads as a finished sentence (`Expectation.finished`)."""
        return self._new(self.turns.judged(turn_id, key, finished))

    def outdated(self, turn_id: int, key: int) -> bool:
        """A `Pause` decode of these frames is no longer worth making: the caller went on talking.
        (Asked from the recognizer's thread just before the decode runs; a stale answer only costs
        a decode.)"""
        return self.turns.spoken_since(turn_id, key)

    def declined(self, turn_id: int, key: int) -> None:
        """The session did not make this `Pause` decode (its recognizer was busy): the turn's end
        must not wait for it."""
        self._requested.discard((turn_id, key))

    def key(self, digit: str, source: str, now: float) -> Key | None:
        """A key press; None when it is the same press already heard from the other source."""
        last = self._last_key
        self._last_key = (digit, now, source)
        if last and last[0] == digit and last[2] != source and now - last[1] < DTMF_DEDUP_S:
            return None
        return Key(digit, source)

    # ---------------------------------------------------------------- decode bookkeeping
    def covering(self, turn: Turn) -> tuple[int, int] | None:
        """The decode in flight that already covers all of `turn` (the latest), if any."""
        keys = [k for k in self._requested if k[0] == turn.turn_id and k[1] >= turn.voiced_frames]
        return max(keys) if keys else None

    def _new(self, events: list[Event]) -> list[Outcome]:
        out: list[Outcome] = []
        for e in events:
            if isinstance(e, Pause):
                key = (e.turn_id, e.key)
                if key in self._requested:
                    continue
                self._requested.add(key)
                self._requested = {k for k in self._requested if k[0] >= e.turn_id - KEEP_DECODES_OF_TURNS + 1}
            out.append(e)
        return out


__all__ = ["Listener", "Key", "Outcome", "Ended", "DTMF_DEDUP_S"]
