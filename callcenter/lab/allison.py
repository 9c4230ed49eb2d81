"""The recordings `ssm:allison` is cloned from, and the ones held out to judge it.

Debian `asterisk-core-sounds-en-wav` holds one professional IVR speaker, Allison Smith, recorded at
8 kHz (CC-BY-SA-3.0); `asterisk-core-sounds-en` has the transcripts (`core-sounds-en.txt.gz`). The
clone may learn from exactly these: the prompts named as `source` in `../shared/eval-real/
manifest.jsonl`, and the `digits/`, `letters/` and `phonetic/` folders. Everything else in the
package is held out: the similarity judge compares the clone with some of it, and none of it (nor
the clone's speech) ever trains or tunes hearing.

    python -m callcenter.lab.allison build/allison      # the folder `voice clone allison --from` reads
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

PACKAGES = ("asterisk-core-sounds-en-wav", "asterisk-core-sounds-en")
SOUNDS = "usr/share/asterisk/sounds/en_US_f_Allison"
TRANSCRIPTS = "usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
FOLDERS = ("digits", "letters", "phonetic")
MANIFEST = Path(__file__).resolve().parents[3] / "shared" / "eval-real" / "manifest.jsonl"
CREDIT = "Allison Smith, Asterisk core sounds (asterisk-core-sounds-en), CC-BY-SA-3.0"
LETTER_WORDS = {"exclaimation-point": "exclamation point"}


def package_root(cache: Path | None = None) -> Path:
    """Where the two packages' files are: installed (/), or unpacked from `apt-get download`."""
    if (Path("/") / SOUNDS).is_dir() and (Path("/") / TRANSCRIPTS).exists():
        return Path("/")
    cache = cache or Path.home() / ".cache" / "callcenter" / "asterisk-sounds"
    if not (cache / SOUNDS).is_dir() or not (cache / TRANSCRIPTS).exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["apt-get", "download", *PACKAGES], cwd=tmp, check=True, capture_output=True)
            for deb in Path(tmp).glob("*.deb"):
                subprocess.run(["dpkg", "-x", str(deb), str(cache)], check=True)
    return cache


def transcripts(root: Path) -> dict[str, str]:
    out = {}
    with gzip.open(root / TRANSCRIPTS, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            if ":" in line and not line.startswith(";"):
                name, _, text = line.partition(":")
                out[name.strip()] = text.strip()
    return out


def spoken(name: str, text: str) -> str:
    """The words as she says them: a lone letter is its name ('A.'), not the article."""
    if name.startswith("letters/"):
        word = name.split("/", 1)[1]
        if word in LETTER_WORDS:
            return LETTER_WORDS[word]
        if len(text) == 1 and text.isalpha():
            return text.upper() + "."
    return text


def clone_names(manifest: Path = MANIFEST, root: Path | None = None) -> list[str]:
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    names = sorted({r["source"] for r in rows if r.get("source")})
    if root is not None:
        sounds = root / SOUNDS
        for folder in FOLDERS:
            names += sorted(f"{folder}/{p.stem}" for p in (sounds / folder).glob("*.wav"))
    return names


def held_out(root: Path, manifest: Path = MANIFEST) -> list[Path]:
    """Top-level prompts of the package that the clone never sees (for the similarity judge)."""
    used = set(clone_names(manifest))
    return sorted(p for p in (root / SOUNDS).glob("*.wav") if p.stem not in used)


def assemble(out: Path, root: Path | None = None, manifest: Path = MANIFEST) -> Path:
    root = root or package_root()
    texts = transcripts(root)
    names = clone_names(manifest, root)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for name in names:
        src = root / SOUNDS / f"{name}.wav"
        if not src.exists() or name not in texts:
            continue
        dst = out / f"{name}.wav"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        lines.append(f"{name}: {spoken(name, texts[name])}\n")
    (out / "transcripts.txt").write_text("".join(lines), encoding="utf-8")
    (out / "CREDIT.txt").write_text(CREDIT + "\n", encoding="utf-8")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    args = p.parse_args()
    out = assemble(args.out)
    print(f"{len(list(out.rglob('*.wav')))} recordings in {out}")


if __name__ == "__main__":
    main()
