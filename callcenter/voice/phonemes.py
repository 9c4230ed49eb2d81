"""Words to phoneme ids with espeak-ng's own text-to-phoneme function (libespeak-ng, through ctypes).

The symbol set is the IPA inventory espeak-ng produces, one Unicode code point per symbol (stress
marks and length marks are symbols of their own), plus punctuation, the word gap and three markers:
``^`` begins an utterance, ``$`` ends it and ``_`` is put between every two symbols — the layout of
VITS/Piper, which lets a teacher voice report a duration for every id we feed the model.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import threading
import unicodedata

from callcenter.errors import CallcenterError

BOS, EOS, PAD = "^", "$", "_"
PUNCTUATION = ",.?!;:"
# espeak-ng's English IPA inventory (as Piper's voices number it), then punctuation and the word gap.
IPA = ("abcdefhijklmnopqrstuvwxyzæçðøħŋœǀǁǂǃɐɑɒɓɔɕɖɗɘəɚɛɜɞɟɠɡɢɣɤɥɦɧɨɪɫɬɭɮɯɰɱɲɳɴɵɶɸɹɺɻɽɾʀʁʂʃʄʈʉʊʋʌʍʎʏʐʑʒʔʕʘʙʛʜʝʟʡʢʰʲ"
       "ˈˌːˑ˞ˤ\u0303\u0327\u0329\u032a\u032fβεθχᵻ↓ⱱ")
SYMBOLS: tuple[str, ...] = (PAD, BOS, EOS, " ") + tuple(PUNCTUATION) + tuple(IPA)
SYMBOL_ID = {s: i for i, s in enumerate(SYMBOLS)}

ESPEAK_LIB = "espeak-ng"
AUDIO_OUTPUT_SYNCHRONOUS = 2
ESPEAK_INITIALIZE_DONT_EXIT = 0x8000
ESPEAK_CHARS_UTF8 = 1
ESPEAK_PHONEMES_IPA = 0x02
CLAUSE_RE = re.compile(r"([^,.?!;:]*)([,.?!;:]*)")


class PhonemizerError(CallcenterError, RuntimeError):
    pass


class Phonemizer:
    """Text in one language to IPA phonemes; one espeak-ng library per process, behind a lock."""

    _lib = None
    _lock = threading.Lock()

    def __init__(self, language: str = "en-us"):
        self.language = language
        self._load()

    @classmethod
    def _load(cls):
        if cls._lib is not None:
            return
        path = ctypes.util.find_library(ESPEAK_LIB) or "libespeak-ng.so.1"
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise PhonemizerError(f"libespeak-ng is not installed (apt-get install espeak-ng): {exc}") from None
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        if lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, None, ESPEAK_INITIALIZE_DONT_EXIT) < 0:
            raise PhonemizerError("espeak-ng failed to initialise (is espeak-ng-data installed?)")
        cls._lib = lib

    def phonemes(self, text: str) -> str:
        """IPA for `text`, clause punctuation kept: 'Hello, bye.' -> 'həlˈoʊ, bˈaɪ.'"""
        out = []
        with self._lock:
            if self._lib.espeak_SetVoiceByName(self.language.encode()) != 0:
                raise PhonemizerError(f"espeak-ng has no language {self.language!r}")
            for words, punct in CLAUSE_RE.findall(text):
                if words.strip():
                    out.append(self._clause(words.strip()))
                if punct:
                    out.append(punct[0] + " ")
                elif words.strip():
                    out.append(" ")
        ipa = re.sub(r"\s+", " ", "".join(out)).strip()
        return unicodedata.normalize("NFD", re.sub(r"\([^)]*\)", "", ipa))

    def _clause(self, text: str) -> str:
        buf = ctypes.create_string_buffer(text.encode("utf-8"))
        ptr = ctypes.c_void_p(ctypes.addressof(buf))
        pieces = []
        while ptr.value:
            result = self._lib.espeak_TextToPhonemes(ctypes.byref(ptr), ESPEAK_CHARS_UTF8, ESPEAK_PHONEMES_IPA)
            if result:
                pieces.append(result.decode("utf-8", errors="replace"))
        return " ".join(pieces)


def phoneme_ids(ipa: str) -> list[int]:
    """Ids in the interleaved layout ^ _ p1 _ p2 _ ... _ $; symbols outside the set are dropped."""
    ids = [SYMBOL_ID[BOS], SYMBOL_ID[PAD]]
    for ch in ipa:
        if ch in SYMBOL_ID:
            ids += [SYMBOL_ID[ch], SYMBOL_ID[PAD]]
    ids.append(SYMBOL_ID[EOS])
    return ids
