"""Turn-taking: when the caller started, whether they are really interrupting, and when they finished.

`TurnDetector` is pure logic over 20 ms frames (already echo-cancelled) and the recognizer's text;
the call session runs the recognizer and reports back with `heard()`. It combines three things:

- **VAD and the noise floor.** A 32 ms window counts as caller speech when silero calls it speech
  *and* it stands `floor_margin_db` above the line's noise floor (the median level of recent windows
  that were not caller speech) and above what the agent's echo may leave (`echo.py`). Background
  talkers on a busy line are speech to silero, but they sit at the floor. Inside a turn, sound far
  below the turn's loudest window is background too (`turn_drop_db`). A turn's audio starts where
  the line rose over its floor just before the speech that started it (silero is slow to rise in
  babble), and a soft last syllable the VAD is sure of must be covered by the text that ends the turn.
- **The recognizer's text.** When the caller pauses, the session decodes what they said so far
  (`Pause`). If that text already answers the node (an intent matched, a yes/no, a digit string of
  the expected length) the turn ends after `quick_end_ms`; if it is clearly unfinished ("my number
  is four seven", a trailing "and") it waits up to `hold_ms`; otherwise the node's own silence.
- **What the node expects** (`Expectation`): yes/no answers end quickly, digit strings get a longer
  silence, because callers pause between digit groups.

Barge-in while the agent talks is two-step: `Started(agent_talking=True)` after `start_ms` of speech
(the session pauses the agent's voice at once: that is the "stop within 100 ms"), then either
`BargeIn` (the caller kept talking for `confirm_ms`, or said something that is not a backchannel)
or `Resume` (it was "mm-hm", "okay", a cough: the agent carries on where it paused).
"""

from __future__ import annotations

import bisect
import re
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from callcenter.audio.frames import FRAME_MS, AudioFrame
from callcenter.audio.stage import Moment
from callcenter.hearing.vad import VAD_WINDOW_MS, SileroVad
from callcenter.text.digits import spoken_digits
from callcenter.text.expecting import Expecting

BACKCHANNELS = frozenset(
    "mm mhm mmhm mm-hm uh-huh uhhuh uh huh hmm yeah yep yup ok okay right sure alright all i see got it "
    "gotcha oh ah aha cool great fine thanks that's exactly absolutely perfect".split()
)  # and agreement: "that's right", "exactly" go along with the agent, they do not take the turn
ECHO_WORD_SHARE = 0.8  # this share of a candidate's words among the agent's own words: it is echo
INTERRUPT_WORDS = frozenset("stop wait hold sorry pardon excuse operator agent human person representative "
                            "help cancel".split())  # not "no": in babble Whisper hears it in "okay, yeah"
INTERRUPT_MIN_WORDS = 3
CONFIDENT_WORDS = 2  # ...or this many, read with at least CONFIDENT confidence, one of them a content
CONFIDENT = 0.5      # word of CONTENT_LETTERS or more (a clear short phrase, not a misheard "uh-huh")
CONTENT_LETTERS = 5
UNFINISHED_ENDINGS = frozenset("and or but so um uh is are was my the a to of er because then".split())
_WORD = re.compile(r"[a-z0-9'-]+")


@dataclass
class Expectation:
    """What the flow node waits for; shapes how long a pause may be before the turn ends."""

    kind: Expecting = Expecting.SPEECH
    end_silence_ms: float = 700
    digits_min: int = 0
    digits_max: int = 0
    answers: Callable[[str], bool] | None = None  # does this text already answer the node?
    # does this text read as a finished sentence (a semantic end of turn)? Slow (a language model), so
    # the call judges it off the media path after a pause's decode and reports with `judged()`
    finished: Callable[[str], bool] | None = None

    def complete(self, text: str) -> bool:
        if self.kind == Expecting.DIGITS:
            # more digits than the node takes is a misheard (often looping) partial, not an answer
            n = len(spoken_digits(text))
            return max(1, self.digits_max or self.digits_min) <= n <= (self.digits_max or n)
        return bool(self.answers and self.answers(text))

    def unfinished(self, text: str) -> bool:
        words = _WORD.findall(text.lower())
        if not words:
            return False
        if self.kind == Expecting.DIGITS:
            n = len(spoken_digits(text))
            return n < max(1, self.digits_min)
        return words[-1] in UNFINISHED_ENDINGS


@dataclass
class TurnConfig:
    threshold: float = 0.5  # silero speech probability
    onset_threshold: float = 0.3  # ... enough for sound this much further above the floor (silero is slow
    onset_margin_db: float = 6.0  # to rise at the start of speech)
    barge_margin_db: float = 6.0  # over the agent, caller speech must stand this far above the floor
    sure_threshold: float = 0.8  # ...or, over the agent, a window the VAD is this sure of
    sure_margin_db: float = 2.0  # ...this far
    floor_margin_db: float = 6.0  # speech must stand this far above the line's noise floor
    floor_window_s: float = 3.0  # the floor: the median level of the non-speech windows this far back
    floor_percentile: float = 50.0
    start_ms: float = 64  # speech needed to declare the caller started
    min_speech_ms: float = 160  # a blip shorter than this is dropped, not a turn
    preroll_ms: float = 300  # audio kept from before the start so the first phoneme is not clipped
    # ...and further back, up to `onset_lookback_ms`, while the line stood within `turn_drop_db` of
    # the starting run and either `onset_rise_db` above its floor (or the agent's echo) or the VAD
    # was past `onset_vad`, with no gap over `onset_gap_ms`: in babble silero rises slowly, and a
    # start declared late lost the caller's first words (bench stt, babble 10 dB: "can I pay by
    # credit card" was heard as "A5 credit"); over the agent's echo the caller's first words stand
    # less than 4 dB above it, where only the VAD tells them ("I need to reset my password" heard
    # as "reset my password")
    onset_lookback_ms: float = 1000
    onset_rise_db: float = 4.0
    onset_gap_ms: float = 128
    onset_margin_ms: float = 100
    onset_vad: float = 0.5
    max_turn_s: float = 30.0
    pause_ms: float = 96  # silence after which the session decodes what was said so far
    # ...and again after `recheck_ms`, with what followed the caller's last word, when the node's
    # silence leaves `recheck_lead_ms` more for that decode before the turn ends (the session makes it
    # only when its recognizer is idle): 96 ms after the last voiced window a soft last word is often
    # still going on, or unheard by the VAD in babble, and Whisper cut there reads it wrong
    # ("...due on March fifteenth" read "...was $1. 50", "a new modem" read "a new motor")
    recheck_ms: float = 400
    recheck_lead_ms: float = 200
    quick_end_ms: float = 300  # silence that ends a turn whose text already answers the node
    finished_end_ms: float = 300  # ...or, at a node that takes free speech, reads as a finished sentence
    hold_ms: float = 2000  # silence allowed while the text is clearly unfinished
    digits_end_ms: float = 1500  # a digits node's silence (callers pause between digit groups)
    yes_no_end_ms: float = 450
    confirm_ms: float = 700  # caller speech over the agent that is a real interruption
    candidate_end_ms: float = 300  # silence that settles a possible interruption (resume or barge in)
    candidate_carry_s: float = 1.0  # speech again this soon after a resume continues the same one
    turn_drop_db: float = 15.0  # inside a turn, sound this far below its loudest window is background
    # ...but a window the VAD is this sure of, above the floor and within `tail_drop_db` of the
    # loudest, up to `tail_span_ms` after the last speech window, is a soft last syllable: it does not
    # hold the turn open, but a decode must cover it before its text can end the turn (babble 10 dB:
    # "since Tues-" and then "day" 12 dB under the turn's loudest, heard as "since two")
    tail_threshold: float = 0.9
    tail_margin_db: float = 2.0
    tail_drop_db: float = 25.0
    tail_span_ms: float = 400
    candidate_drop_db: float = 10.0  # ... and over the agent (background talk after an "mm-hm")
    partial_every_ms: float = 1000  # decode a partial result this often while the caller talks


@dataclass
class Turn:
    """One stretch of caller speech."""

    pcm: bytes
    started_at: float
    ended_at: float
    text: str | None = None  # the recognizer's text, when a decode already covers the whole turn
    confidence: float = 0.0
    over_agent: bool = False  # the caller spoke while the agent was talking
    turn_id: int = 0
    voiced_frames: int = 0  # frames up to the last voiced one: a decode of this many covers the turn
    text_key: int = 0  # frames the decode behind `text` covered

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 2 / 8000


@dataclass
class Started:
    at: float
    agent_talking: bool


@dataclass
class Pause:
    """Decode this much of the turn (the caller paused, or a partial result is due)."""

    pcm: bytes
    turn_id: int
    key: int  # frames of the turn it covers; give both back to `heard()`
    partial: bool  # True: a periodic partial while the caller is still talking
    over_agent: bool = False  # ...over the agent: its text may settle an interruption (else it is for show)
    recheck: bool = False  # a second look after `recheck_ms` of silence: worth making only when idle


@dataclass
class Ended:
    turn: Turn
    silence_ms: float  # how long the caller had been quiet when the turn ended
    why: str = "silence"  # silence | answer (its text answers the node) | finished (reads as a finished
    #                       sentence) | unfinished (held longer) | length (max_turn_s)


@dataclass
class Discarded:
    at: float
    reason: str  # too short, backchannel, noise


@dataclass
class BargeIn:
    at: float
    reason: str


@dataclass
class Resume:
    at: float
    reason: str


Event = Started | Pause | Ended | Discarded | BargeIn | Resume


def is_backchannel(text: str) -> bool:
    words = _WORD.findall(text.lower())
    return bool(words) and len(words) <= 3 and all(w.strip("-") in BACKCHANNELS for w in words)


@dataclass
class _Heard:
    key: int
    text: str
    confidence: float
    finished: bool = False  # judged a finished sentence (Expectation.finished)
    guessed: bool = False  # the recognizer picked it for its length: it answers, but does not end the turn early


class RollingPercentile:
    """A percentile of the last `window` values, as np.percentile (linear) gives it, kept in a
    sorted list: an insert and a removal per value instead of sorting the window every 32 ms."""

    def __init__(self, window: int, q: float):
        self.q = q
        self._recent: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._recent)

    def add(self, value: float) -> None:
        if len(self._recent) == self._recent.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self._recent[0])]
        self._recent.append(value)
        bisect.insort(self._sorted, value)

    def value(self) -> float:
        s = self._sorted
        at = self.q / 100 * (len(s) - 1)
        lo = int(at)
        if lo + 1 >= len(s):
            return s[lo]
        return s[lo] + (s[lo + 1] - s[lo]) * (at - lo)


class TurnDetector:
    def __init__(self, config: TurnConfig | None = None, vad: SileroVad | None = None) -> None:
        self.config = config or TurnConfig()
        self.vad = vad or SileroVad()
        self.expect = Expectation()
        self._preroll: deque[AudioFrame] = deque(maxlen=max(1, int(max(self.config.preroll_ms,
                                                                       self.config.onset_lookback_ms) // FRAME_MS)))
        # (frames seen by the window's end, its level, the line's floor or echo, the VAD's p) for the onset look-back
        self._rises: deque[tuple[int, float, float, float]] = deque(maxlen=int(self.config.onset_lookback_ms // VAD_WINDOW_MS) + 8)
        self._frames_seen = 0
        self._levels = RollingPercentile(int(self.config.floor_window_s * 1000 / VAD_WINDOW_MS),
                                         self.config.floor_percentile)
        self._window_energy: list[float] = []
        self._window_echo = 0.0
        self._agent_words: set[str] = set()
        self._resumed_at = -1e9
        self._carried_ms = 0.0
        self.floor_db = -100.0
        self.turn_id = 0
        self._reset_turn()

    # ------------------------------------------------------------ state
    def _reset_turn(self) -> None:
        self.turn_id += 1
        self.in_speech = False
        self._speech_run_ms = 0.0
        self._silence_ms = 0.0
        self._voiced_ms = 0.0
        self._frames: list[AudioFrame] = []
        self._last_voiced = 0  # frames of the turn up to the last voiced (or soft last syllable) one
        self._start_t = 0.0
        self._over_agent = False
        self._confirmed = False
        self._paused_decode_key = -1
        self._recheck_key = -1
        self._last_partial_ms = 0.0
        self._heard: _Heard | None = None
        self._peak_db = -120.0

    def expecting(self, expect: Expectation) -> None:
        self.expect = expect

    def agent_saying(self, text: str) -> None:
        """The words the agent is speaking now: a candidate interruption made of them is its echo."""
        self._agent_words = set(_WORD.findall(text.lower()))

    def interrupts(self, text: str, confidence: float = 0.0) -> bool:
        """Is this (said over the agent) a real interruption?"""
        return self._not_an_interruption(text, confidence) is None

    def _not_an_interruption(self, text: str, confidence: float = 0.0) -> str | None:
        """Why this, said over the agent, is not an interruption; None when it is one. It is when it
        is not a backchannel, not the agent's own echo, and either a few words, one of the words
        callers stop an agent with, an answer to the node, or two words read with confidence, one
        of them a content word. Otherwise one or two unknown words are more often background talk
        misheard than the caller (who, if they go on, is confirmed by `confirm_ms` of speech
        anyway)."""
        if not text.strip():
            return "noise"
        words = _WORD.findall(text.lower())
        if not words:
            return "not an interruption"
        if is_backchannel(text):
            return "backchannel"
        if self.is_echo(text):
            return "echo"
        if len(words) >= INTERRUPT_MIN_WORDS or set(words) & INTERRUPT_WORDS or self.expect.complete(text):
            return None
        if len(words) >= CONFIDENT_WORDS and confidence >= CONFIDENT and \
                any(len(w) >= CONTENT_LETTERS for w in words):
            return None
        return "not an interruption"

    def is_echo(self, text: str) -> bool:
        words = _WORD.findall(text.lower())
        if not words or not self._agent_words:
            return False
        return sum(w in self._agent_words for w in words) >= ECHO_WORD_SHARE * len(words)

    @property
    def candidate(self) -> bool:
        """The caller is talking over the agent and it is not yet decided whether that interrupts."""
        return self.in_speech and self._over_agent and not self._confirmed

    def _covers(self, key: int) -> bool:
        """Text of the turn's first `key` frames covers every voiced frame of it so far."""
        return key >= self._last_voiced

    def spoken_since(self, turn_id: int, key: int) -> bool:
        """The caller spoke again in turn `turn_id`, which goes on, after its first `key` frames: text
        of only those frames can no longer end the turn."""
        return self.in_speech and turn_id == self.turn_id and not self._covers(key)

    # ------------------------------------------------------------ input
    def heard(self, turn_id: int, key: int, text: str, confidence: float, guessed: bool = False) -> list[Event]:
        """The recognizer's text for the first `key` frames of turn `turn_id`."""
        if not self.in_speech or turn_id != self.turn_id or key > len(self._frames):
            return []
        if self._heard is None or key >= self._heard.key:
            self._heard = _Heard(key, text, confidence, guessed=guessed)
        if self.candidate and self._covers(key) and self.interrupts(text, confidence):
            self._confirmed = True
            return [BargeIn(self._start_t, "speech")]
        return []

    def judged(self, turn_id: int, key: int, finished: bool) -> list[Event]:
        """`Expectation.finished` on the text that `heard()` got for these frames."""
        h = self._heard
        if self.in_speech and turn_id == self.turn_id and h is not None and h.key == key:
            h.finished = finished
        return []

    def process(self, frame: AudioFrame, at: Moment) -> list[Event]:
        """`frame` is what the turn keeps (and the recognizer hears); the speech decisions are made on
        `at.decide_on` when given (the noise gate's output). `at.echo_floor`: power of the agent's
        echo that may be left in the frame; only caller sound above it counts."""
        t, agent_talking, echo_floor = at.t, at.agent_talking, at.echo_floor
        out: list[Event] = []
        x = (at.decide_on or frame).as_float()
        probs = self.vad.feed(x)
        self._window_energy.append(float(np.mean(x * x)))
        self._window_echo = max(self._window_echo, echo_floor)
        self._frames_seen += 1
        if self.in_speech:
            self._frames.append(frame)
        else:
            self._preroll.append(frame)
        for p in probs:
            level = 10 * np.log10(np.mean(self._window_energy) + 1e-12)
            echo_db = 10 * np.log10(self._window_echo + 1e-12)
            self._window_energy.clear()
            self._window_echo = 0.0
            if not self._levels:
                self._levels.add(level)
            self.floor_db = self._levels.value()
            base_db = max(self.floor_db, echo_db)  # what caller sound must stand above
            talking = agent_talking and (not self.in_speech or self.candidate)
            margin = self.config.barge_margin_db if talking else self.config.floor_margin_db
            above = base_db + margin
            if self.in_speech:
                drop = self.config.candidate_drop_db if self.candidate else self.config.turn_drop_db
                above = max(above, self._peak_db - drop)
            speech = (p >= self.config.threshold and level >= above) or \
                (p >= self.config.onset_threshold and level >= above + self.config.onset_margin_db)
            if (talking or self.in_speech and self._over_agent) and not speech and p >= self.config.sure_threshold:
                # over the agent in babble the caller may stand only a few dB above the line: a
                # window the VAD is sure of needs less margin (the echo canceller's residual and
                # background talkers rarely make it that sure, bench stt's silent-caller rows); so
                # too for the rest of a turn that interrupted the agent, whose floor was learnt
                # over the agent's echo
                sure = base_db + self.config.sure_margin_db
                if self.in_speech:
                    sure = max(sure, self._peak_db - self.config.candidate_drop_db)
                speech = level >= sure
            if speech or not self.in_speech:
                self._peak_db = max(self._peak_db, level) if self.in_speech else level
            if not speech:
                self._levels.add(level)  # the floor learns from what is not caller speech
            self._rises.append((self._frames_seen, level, base_db, p))
            soft = self.in_speech and not self.candidate and not speech and p >= self.config.tail_threshold and \
                level >= max(base_db + self.config.tail_margin_db, self._peak_db - self.config.tail_drop_db)
            out += self._window(speech, t, agent_talking, soft)
        return out

    # ------------------------------------------------------------ decisions per VAD window
    def _window(self, speech: bool, t: float, agent_talking: bool, soft: bool = False) -> list[Event]:
        cfg = self.config
        if not self.in_speech:
            self._speech_run_ms = self._speech_run_ms + VAD_WINDOW_MS if speech else 0.0
            if self._speech_run_ms < cfg.start_ms:
                return []
            self.in_speech = True
            self._start_t = t - self._speech_run_ms / 1000
            self._voiced_ms = self._speech_run_ms
            if agent_talking and self._start_t - self._resumed_at <= cfg.candidate_carry_s:
                self._voiced_ms += self._carried_ms  # a noisy line cut the caller's phrase in pieces
            self._over_agent = agent_talking
            self._frames = list(self._preroll)[-self._onset_frames():]
            self._last_voiced = len(self._frames)
            self._preroll.clear()
            return [Started(self._start_t, agent_talking)]
        out: list[Event] = []
        if speech:
            self._silence_ms = 0.0
            self._voiced_ms += VAD_WINDOW_MS
            self._last_voiced = len(self._frames)
            if self.candidate and self._voiced_ms >= cfg.confirm_ms:
                self._confirmed = True
                out.append(BargeIn(self._start_t, "kept talking"))
            if self._voiced_ms - self._last_partial_ms >= cfg.partial_every_ms:
                self._last_partial_ms = self._voiced_ms
                out.append(Pause(self._pcm(len(self._frames)), self.turn_id, len(self._frames), partial=True,
                                 over_agent=self._over_agent))
            return out
        self._silence_ms += VAD_WINDOW_MS
        why = None  # what the text covering the turn says of its end (`_why`), asked once a window
        if soft and self._silence_ms <= cfg.tail_span_ms:  # a soft last syllable: the text must cover
            # it, but it does not hold the turn open
            self._last_voiced = len(self._frames)
        elif self._silence_ms >= cfg.pause_ms and self._paused_decode_key != self._last_voiced:
            self._paused_decode_key = self._last_voiced
            key = len(self._frames)  # all of it: a soft last sound may sit under the voiced windows
            out.append(Pause(self._pcm(key), self.turn_id, key, partial=False))
        elif self._silence_ms >= cfg.recheck_ms and self._recheck_key != self._last_voiced and not self.candidate:
            why = self._why(self._covering())
            if self._end_silence_ms(why) >= cfg.recheck_ms + cfg.recheck_lead_ms:
                self._recheck_key = self._last_voiced
                key = len(self._frames)
                out.append(Pause(self._pcm(key), self.turn_id, key, partial=False, recheck=True))
        if len(self._frames) * FRAME_MS / 1000 >= cfg.max_turn_s:
            out.append(self._end(t, "length"))
            return out
        why = why or self._why(self._covering())
        if self._silence_ms >= self._end_silence_ms(why):
            out.append(self._end(t, why))
        elif self.candidate and self._silence_ms >= self._candidate_end_ms():
            out.append(self._end(t))
        return out

    def _onset_frames(self) -> int:
        """How many frames before now the turn starts: `preroll_ms` before the speech run that started
        it, or earlier where the line had already risen over its floor just before that run."""
        cfg = self.config
        window_frames = VAD_WINDOW_MS / FRAME_MS
        run = int(round(self._speech_run_ms / VAD_WINDOW_MS))
        rises = list(self._rises)
        loudest = max((level for _, level, _, _ in rises[len(rises) - run:]), default=-120.0)
        onset = self._frames_seen - run * window_frames  # the run's first frame
        gap = 0.0
        for seen, level, base_db, p in reversed(rises[:len(rises) - run]):
            if level >= loudest - cfg.turn_drop_db and (level >= base_db + cfg.onset_rise_db or p >= cfg.onset_vad):
                onset, gap = seen - window_frames, 0.0
            else:
                gap += VAD_WINDOW_MS
                if gap > cfg.onset_gap_ms:
                    break
        back = self._frames_seen - onset + cfg.onset_margin_ms / FRAME_MS
        return max(1, int(round(max(back, cfg.preroll_ms // FRAME_MS))))  # the preroll's length bounds it

    def _covering(self) -> _Heard | None:
        """The latest text, if it covers every voiced frame of the turn."""
        h = self._heard
        return h if h is not None and self._covers(h.key) else None

    def _end_silence_ms(self, why: str) -> float:
        """The silence that ends the turn, given what its text says (`_why`)."""
        cfg = self.config
        base = {Expecting.DIGITS: max(self.expect.end_silence_ms, cfg.digits_end_ms),
                Expecting.YES_NO: min(self.expect.end_silence_ms, cfg.yes_no_end_ms)}.get(self.expect.kind,
                                                                               self.expect.end_silence_ms)
        return {"answer": min(base, cfg.quick_end_ms), "unfinished": max(base, cfg.hold_ms),
                "finished": min(base, cfg.finished_end_ms)}.get(why, base)

    def _candidate_end_ms(self) -> float:
        """Over the agent: a sound followed by a pause is settled once its text is known; the pause
        must be long enough that a caller's phrase in a noisy line is not cut into pieces."""
        return self.config.candidate_end_ms if self._covering() is not None else self.config.hold_ms

    def _why(self, heard: _Heard | None) -> str:
        """What the text that covers the turn says about its end (see `Ended.why`)."""
        if heard is None or heard.guessed:  # no text yet, or one picked for its length: the node's silence decides
            return "silence"
        if self.expect.complete(heard.text):
            return "answer"
        if self.expect.unfinished(heard.text):
            return "unfinished"
        if heard.finished and self.expect.kind == Expecting.SPEECH:
            return "finished"
        return "silence"

    def _end(self, t: float, why: str = "silence") -> Event:
        cfg = self.config
        frames, voiced, start, heard = self._frames, self._voiced_ms, self._start_t, self._covering()
        turn_id, last_voiced = self.turn_id, self._last_voiced
        over_agent, confirmed, silence = self._over_agent, self._confirmed, self._silence_ms
        self._reset_turn()
        if voiced < cfg.min_speech_ms and not (heard is not None and self.expect.complete(heard.text)):
            # short and not an answer the recognizer read: a blip. A short answer ("yes", "two")
            # is kept however little of it was voiced
            return self._discard(t, "too short", over_agent and not confirmed, voiced, frames)
        if over_agent and not confirmed:
            reason = self._not_an_interruption(heard.text, heard.confidence) if heard is not None else "noise"
            if reason is not None:
                # only words that may start a longer phrase carry their speech into the next piece
                return self._discard(t, reason, True, voiced if reason == "not an interruption" else 0.0, frames)
        pcm = b"".join(f.pcm for f in frames)
        turn = Turn(pcm, start, t, heard.text if heard else None, heard.confidence if heard else 0.0,
                    over_agent, turn_id, last_voiced, heard.key if heard else 0)
        return Ended(turn, silence, why)

    def _discard(self, t: float, reason: str, resume: bool, voiced_ms: float, frames: list[AudioFrame]) -> Event:
        # a piece discarded stays the line's recent past: a turn starting just after it looks back
        # into it for its onset ("I moved to", taken over the agent for background talk, then "a new
        # address last month" confirmed: the caller's first words were lost with the piece)
        self._preroll.extend(frames)
        if resume:
            self._resumed_at, self._carried_ms = t, voiced_ms
            return Resume(t, reason)
        return Discarded(t, reason)

    def _pcm(self, frames: int) -> bytes:
        return b"".join(f.pcm for f in self._frames[:frames])
