"""Answering-machine detection: was a dialled call answered by a person or by a machine?

`AnsweringMachineDetector` is pure logic over the 20 ms frames the far end sends from the moment it
answers, and over the recognizer's words, which the call reports back with `heard()`. It weighs
three things:

- **The greeting's speech and silence.** A person says "Hello?" (or "Hello, this is Dana
  speaking") and waits; a machine speaks for seconds. A frame is speech when silero calls it
  speech and it stands `floor_margin_db` over the line's floor (the quiet end of the last 3 s:
  an office's talkers behind a person sit there). When the far end has spoken and
  then kept quiet for `greeting_gap_ms`, the greeting sounds like a person's: `Greeted` (the call
  starts its flow at once, so a person hears no dead air), and after `person_quiet_ms` of quiet the
  decision is *person*. More than `machine_speech_s` of speech in the greeting is a *machine*,
  unless its words are a person's ("speaking", "how can I help").
- **The words.** The call decodes each stretch of greeting (`WantWords`). "Leave a message", "not
  available", "after the tone", "you have reached", a carrier's "not in service": *machine*.
- **The beep.** A steady single tone for `beep_min_ms` or more is a machine's beep: *machine*, and
  its end (`BeepEnded`) is where the message starts.

A *person* decision is revised to *machine* only by a beep or by machine words heard within
`analysis_s`; after that the detector stops. A silent pickup starts the flow after
`silent_pickup_s` (`Greeted`), and stays *unknown* unless the far end then shows what it is.
After *machine*, the detector waits for the beep, or for `greeting_over_s` of quiet where there is
none (`GreetingOver`): then the call leaves its message.

Never built or tuned on the Asterisk recordings (see `../shared/README.md`): its settings come from
`callcenter/lab/amd_set.py`'s generated greetings.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

import numpy as np

from callcenter.audio.frames import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, AudioFrame, pcm_to_float
from callcenter.audio.stage import Moment
from callcenter.hearing.vad import VAD_WINDOW_MS, SileroVad

PERSON, MACHINE, UNKNOWN = "person", "machine", "unknown"

MACHINE_WORDS = re.compile(
    r"\bleave\b[\w' ,]{0,25}\b(message|name and|number)|\b(after|at) the (tone|beep)"
    r"|not (available|here|in service|able to (take|answer|come))|unavailable|(can't|cannot|can not|unable to) "
    r"(come to|get to|take|answer) (the|your|my)|voice ?mail|mail ?box|record (your|a) message"
    r"|(you've|you have|you) reached|been disconnected|no longer in service|try (again|your call) later"
    r"|number you (have )?dialed|(person|party|subscriber|customer) you (are|were|have) (calling|trying|dialed)"
    r"|get back to you|return your call|call you back|(office|we) (is|are) (now )?(closed|away)"
    r"|business hours|away from (the|my) (phone|desk)|at the moment|right now|press (one|1|pound|star|zero)"
    r"|please hold|forwarded to|automated|hang up")
PERSON_WORDS = re.compile(
    r"\bspeaking\b|how (can|may) (i|we) help|who('s| is) (this|calling)|can i help|what can i do for you"
    r"|^\W*(hello|hi|hey|yes|yeah|yep|hallo)\W*(hello\W*)?$")
_NOT_WORDS = re.compile(r"[^\w']+")  # the recognizer's punctuation splits "how can I? Help you."


@dataclass
class AmdSettings:
    greeting_gap_ms: float = 200.0  # quiet after speech that ends a person-like greeting: the flow starts
    person_quiet_ms: float = 760.0  # ...and this much quiet after a short greeting: a person
    short_greeting_s: float = 2.0  # a greeting up to this long (speech) may be a person's by its shape
    machine_speech_s: float = 4.0  # more speech than this in the greeting: a machine (unless a person's words)
    silent_pickup_s: float = 1.5  # nobody speaks: the flow starts, the decision waits
    long_greeting_quiet_s: float = 1.2  # ...and as long after a long greeting that words did not settle
    analysis_s: float = 8.0  # the detector decides (or gives up: unknown) within this time of the answer
    greeting_over_s: float = 1.6  # after a machine decision, quiet this long (and no beep): leave the message
    late_beep_s: float = 4.0  # ...a beep this soon after it still restarts the message after the beep
    machine_wait_s: float = 20.0  # a machine still talking this long after the decision: leave the message anyway
    beep_min_ms: float = 140.0  # a steady tone this long is a beep
    beep_tonal: float = 0.8  # share of the frame's energy within a few bins of its peak (a pure tone: ~0.9)
    beep_drift_hz: float = 20.0  # ...at one pitch: a voice's pitch moves more than this frame to frame
    beep_min_db: float = -45.0  # a beep is at least this loud (dBFS)
    vad_threshold: float = 0.5
    floor_margin_db: float = 6.0
    floor_percentile: float = 10.0  # of the last 3 s of frame levels
    words_every_s: float = 1.5  # decode a greeting still going on this often


@dataclass(frozen=True)
class Greeted:
    """The greeting sounds like a person's (or nobody spoke): start the flow now."""
    t: float
    speech_s: float


@dataclass(frozen=True)
class Decided:
    label: str
    t: float  # seconds since the answer
    why: str
    revised: bool = False  # a person decision overturned


@dataclass(frozen=True)
class WantWords:
    """Decode this stretch of the far end's audio and report the text with `heard()`."""
    pcm: bytes
    t: float


@dataclass(frozen=True)
class BeepEnded:
    start: float
    end: float
    hz: float


@dataclass(frozen=True)
class GreetingOver:
    """After a machine decision, the greeting has ended without a beep: leave the message now."""
    t: float


Event = Greeted | Decided | WantWords | BeepEnded | GreetingOver


TONE_FFT = 512
_WINDOW = np.hanning(FRAME_SAMPLES)
_FREQS = np.fft.rfftfreq(TONE_FFT, 1 / SAMPLE_RATE)
_BAND = (_FREQS >= 200) & (_FREQS <= 3800)
_PEAK_LO, _PEAK_HI = int(np.searchsorted(_FREQS, 300)), int(np.searchsorted(_FREQS, 3000))


def tone_of(samples: np.ndarray) -> tuple[float, float]:
    """(peak frequency in Hz, share of the frame's 200–3800 Hz energy within ±3 bins of it)."""
    window = _WINDOW if len(samples) == FRAME_SAMPLES else np.hanning(len(samples))
    spec = np.abs(np.fft.rfft(samples * window, TONE_FFT)) ** 2
    total = float(spec[_BAND].sum()) + 1e-12
    peak = _PEAK_LO + int(np.argmax(spec[_PEAK_LO:_PEAK_HI]))
    near = float(spec[max(0, peak - 3):peak + 4].sum())
    return float(_FREQS[peak]), near / total


class ToneRuns:
    """Runs of frames that are one steady tone: `feed` each frame; a run long enough to be a beep
    comes back when it ends (the detector's beeps, and the bench's search for a clip's beep)."""

    def __init__(self, settings: AmdSettings):
        self.s = settings
        self.hz: list[float] = []  # peak frequencies of the run going on
        self.start = 0.0

    @property
    def active(self) -> bool:
        return bool(self.hz)

    def feed(self, x: np.ndarray, level: float, start: float) -> BeepEnded | None:
        """One frame (float samples, its level in dBFS, when it starts); the beep that just ended."""
        s = self.s
        hz, share = tone_of(x) if level >= s.beep_min_db else (0.0, 0.0)
        if share >= s.beep_tonal and (not self.hz or abs(hz - self.hz[-1]) <= s.beep_drift_hz):
            if not self.hz:
                self.start = start
            self.hz.append(hz)
            return None
        ended = BeepEnded(self.start, start, round(float(np.median(self.hz)))) \
            if len(self.hz) * FRAME_MS >= s.beep_min_ms else None
        self.hz = [hz] if share >= s.beep_tonal else []  # a tone of another pitch starts a run of its own
        self.start = start
        return ended


class AnsweringMachineDetector:
    def __init__(self, settings: AmdSettings | None = None, vad: SileroVad | None = None):
        self.s = settings or AmdSettings()
        self.vad = vad or SileroVad()
        self.t = 0.0
        self.decision: Decided | None = None
        self.greeted: Greeted | None = None
        self.done = False  # nothing more to decide or wait for
        self.over: GreetingOver | None = None  # a machine's greeting ended without a beep (a late beep still counts)
        self.speech_s = 0.0  # speech heard in the greeting
        self.greeting_end: float | None = None  # where the far end last stopped speaking
        self.words = ""
        self._prob = 0.0
        self._levels: deque[float] = deque(maxlen=int(3000 / FRAME_MS))
        self._speaking = False
        self._quiet_s = 0.0
        self._since_words_s = 0.0
        self._pcm = bytearray()  # the greeting's audio not yet sent for words
        self._tones = ToneRuns(self.s)

    # ---------------------------------------------------------------- inputs
    def process(self, frame: AudioFrame, at: Moment) -> list[Event]:
        """One 20 ms frame of what the far end sends (the detector keeps its own clock from the
        answer: `at` is not needed)."""
        out: list[Event] = []
        if self.done:
            return out
        pcm = frame.pcm
        x = pcm_to_float(pcm)
        if len(x) != FRAME_SAMPLES:
            x = np.resize(x, FRAME_SAMPLES)
        level = 10 * np.log10(float(np.mean(x * x)) + 1e-10)
        for p in self.vad.feed(x.astype(np.float32)):
            self._prob = p
        start = self.t
        self.t = round(self.t + FRAME_MS / 1000, 3)
        out += self._beep(x, level, start)
        # the line's floor: the quiet end of every frame's level (an office's talkers behind a person
        # are speech to silero, but they sit at the floor, where the person's own pauses are)
        self._levels.append(level)
        floor = np.percentile(self._levels, self.s.floor_percentile) if len(self._levels) >= 10 else -70.0
        speech = self._prob >= self.s.vad_threshold and level >= floor + self.s.floor_margin_db and \
            not self._tones.active
        out += self._speech(speech, pcm)
        out += self._timers()
        return out

    def heard(self, text: str) -> list[Event]:
        """The recognizer's words for a stretch of the greeting."""
        text = _NOT_WORDS.sub(" ", text.lower().replace("’", "'")).strip()
        if not text or self.done:
            return []
        self.words = f"{self.words} {text}".strip()
        if machine := MACHINE_WORDS.search(text):
            return self._decide(MACHINE, f"words: {machine.group(0)!r}")
        if self.decision is None and self.speech_s > self.s.short_greeting_s and \
                (person := PERSON_WORDS.search(self.words)):
            # a long greeting in a person's words ("Acme dental, Dana speaking, how can I help?")
            return self._decide(PERSON, f"words: {person.group(0)!r}")
        return []

    # ---------------------------------------------------------------- the parts
    def _speech(self, speech: bool, pcm: bytes) -> list[Event]:
        out: list[Event] = []
        step = FRAME_MS / 1000
        if speech:
            self._speaking, self._quiet_s = True, 0.0
            self.speech_s += step
            self._since_words_s += step
            self._pcm += pcm
            if self._since_words_s >= self.s.words_every_s and self.decision is None:
                out += self._want_words()
            if self.speech_s > self.s.machine_speech_s and self.decision is None and \
                    not PERSON_WORDS.search(self.words):
                out += self._decide(MACHINE, f"{self.speech_s:.1f} s of greeting")
            return out
        if self._speaking:  # the quiet after speech: keep a little of it with the words' audio
            self._pcm += pcm
            self._quiet_s += step
            if self._quiet_s * 1000 >= self.s.greeting_gap_ms:
                self._speaking = False
                self.greeting_end = round(self.t - self._quiet_s, 3)
                if self._since_words_s >= 0.3 and (self.decision is None or self.decision.label == PERSON):
                    out += self._want_words()
                if self.greeted is None and self.speech_s <= self.s.short_greeting_s:
                    self.greeted = Greeted(self.t, round(self.speech_s, 2))
                    out.append(self.greeted)
        else:
            self._quiet_s += step
        return out

    def _timers(self) -> list[Event]:
        out: list[Event] = []
        s = self.s
        if self.greeted is None and self.speech_s == 0 and self.t >= s.silent_pickup_s:
            self.greeted = Greeted(self.t, 0.0)
            out.append(self.greeted)
        if self.greeted is None and self.decision is None and self.greeting_end is not None and \
                not self._speaking and self._quiet_s >= s.long_greeting_quiet_s:
            # a long greeting, neither a person's words nor a machine's, and then quiet: the flow
            # starts (no dead air for a person who said a lot), the decision waits
            self.greeted = Greeted(self.t, round(self.speech_s, 2))
            out.append(self.greeted)
        if self.decision is None and self.greeting_end is not None and not self._speaking and \
                self.speech_s <= s.short_greeting_s and self._quiet_s * 1000 >= s.person_quiet_ms:
            out += self._decide(PERSON, f"{self.speech_s:.1f} s of greeting, then quiet")
        if self.decision is not None and self.decision.label == MACHINE:
            if self.over is not None:
                self.done = self.t - self.over.t >= s.late_beep_s
            elif not self._tones.active and (not self._speaking and self._quiet_s >= s.greeting_over_s
                                     or self.t - self.decision.t >= s.machine_wait_s):
                self.over = GreetingOver(self.t)
                out.append(self.over)
        elif self.t >= s.analysis_s:
            if self.decision is None:
                out += self._decide(UNKNOWN, f"nothing decided in {s.analysis_s:.0f} s")
            self.done = True
        return out

    def _beep(self, x: np.ndarray, level: float, start: float) -> list[Event]:
        beep = self._tones.feed(x, level, start)
        if beep is None:
            return []
        self.done = True  # the message starts now
        return [*self._decide(MACHINE, f"a {beep.hz:.0f} Hz beep"), beep]

    def _want_words(self) -> list[Event]:
        pcm, self._pcm, self._since_words_s = bytes(self._pcm), bytearray(), 0.0
        return [WantWords(pcm, self.t)] if len(pcm) >= SAMPLE_RATE * 2 * VAD_WINDOW_MS / 1000 else []

    def _decide(self, label: str, why: str) -> list[Event]:
        if self.decision is not None and (self.decision.label == label or self.decision.label == MACHINE):
            return []
        revised = self.decision is not None
        self.decision = Decided(label, self.t, why, revised)
        out: list[Event] = [self.decision]
        if label != MACHINE and self.greeted is None:  # a long greeting in a person's words: the flow starts
            self.greeted = Greeted(self.t, round(self.speech_s, 2))
            out.append(self.greeted)
        return out


__all__ = ["AmdSettings", "AnsweringMachineDetector", "BeepEnded", "Decided", "Greeted", "GreetingOver", "MACHINE",
           "PERSON", "ToneRuns", "UNKNOWN", "WantWords", "tone_of"]
