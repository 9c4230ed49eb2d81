"""Hearing a flow's names back (`callcenter flows check --hear`): every fixed sentence that holds a
name (a capitalised word inside a sentence, or a word with letters beyond English's) is said by the
flow's own voice and transcribed by the agent's own recognizer. A name the recognizer does not hear
back is one the voice may say wrongly ("Sonnenschein" came out as "fun and team"), so a caller may
not understand it either: the author is told where it is, and what was heard instead.

Only names are judged: ordinary English words the voice says well, and a recognizer's odd slip on
one of them is not the author's problem."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

from callcenter.voice.text import normalize, words

NAME_RE = re.compile(r"(?<![\w'])([A-Z][\w'-]*[a-z][\w'-]*|\w*[^\W\d_a-zA-Z]\w*)")
SENTENCE_START_RE = re.compile(r"(?:^|[.!?:]\s+)$")


@dataclass(frozen=True)
class Misheard:
    name: str
    sentence: str
    heard: str


def names_in(sentence: str) -> list[str]:
    """The words that are names: capitalised inside a sentence (not its first word), or holding a
    letter English does not use (ü, é, ß...)."""
    out = []
    for m in NAME_RE.finditer(sentence):
        word = m.group(1)
        foreign = any(c.isalpha() and not c.isascii() for c in word)
        if foreign or not SENTENCE_START_RE.search(sentence[:m.start()]):
            out.append(word)
    return list(dict.fromkeys(out))


def _heard(name: str, heard_words: set[str]) -> bool:
    return all(part in heard_words for part in words(normalize(name)))


async def hear_back(flow, stt) -> list[Misheard]:
    """Each fixed sentence with a name, said by its voice and transcribed: the names not heard."""
    from callcenter.dialog.flow import spoken_prompts
    from callcenter.voice.speaker import make_tts

    voices: dict = {}
    out = []
    for sentence, voice in spoken_prompts(flow):
        names = names_in(sentence)
        if not names:
            continue
        key = voice.model_dump_json()
        if key not in voices:
            voices[key] = make_tts(voice)
        pcm = b"".join([frame.pcm async for frame in voices[key].stream(sentence)])
        heard = await asyncio.to_thread(lambda: stt.transcribe_pcm(pcm).text)
        heard_words = set(words(normalize(heard)))
        out += [Misheard(name, sentence, heard.strip()) for name in names if not _heard(name, heard_words)]
    return out


def where(path: Path, word: str) -> str:
    """path:line:col of the word's first use in the flow file (the file itself if not found)."""
    try:
        for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            col = line.find(word)
            if col >= 0:
                return f"{path}:{n}:{col + 1}"
    except OSError:
        pass
    return str(path)
