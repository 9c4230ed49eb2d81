"""Per-call stereo recording (left: caller, right: agent) written so a crash never loses it.

The WAV header is rewritten with the true sizes every `HEADER_REFRESH_FRAMES` frames and on close;
`repair_wav` fixes the header of a file left by a killed process (run at every `serve` start).
Even unrepaired, such a file is a valid WAV holding everything up to the last refresh.
"""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

from callcenter.audio.frames import FRAME_BYTES, FRAME_MS, SAMPLE_RATE, SAMPLE_WIDTH

CHANNELS = 2
HEADER_BYTES = 44
HEADER_REFRESH_FRAMES = 1000 // FRAME_MS  # once a second
FLUSH_FRAMES = 200 // FRAME_MS  # audio reaches the file every 200 ms


FILE_MODE = 0o600  # recordings and transcripts: the agent's user alone
FOLDER_MODE = 0o700


def private_folder(path: str | Path) -> Path:
    """A folder only the agent's user can enter, made with its missing parents (each mode 700). A
    folder that exists already keeps its mode: `serve` makes its recordings private itself
    (`make_private`), and a folder a user named (`simulate --out .`) is theirs."""
    path = Path(path)
    missing = [p for p in [path, *path.parents] if not p.exists()]
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=FOLDER_MODE)
        except FileExistsError:
            continue
        os.chmod(folder, FOLDER_MODE)  # mkdir's mode is cut by the umask
    return path


def make_private(root: str | Path) -> None:
    """The recordings folder, its day folders and their files: 700 and 600 (from older versions,
    or copied in by hand). Links are left alone, never followed."""
    root = private_folder(root)
    os.chmod(root, FOLDER_MODE)
    for day in root.iterdir():
        if day.is_symlink():
            continue
        if day.is_dir():
            os.chmod(day, FOLDER_MODE)
            for f in day.iterdir():
                if f.is_file() and not f.is_symlink():
                    os.chmod(f, FILE_MODE)
        elif day.is_file():
            os.chmod(day, FILE_MODE)


def create_private(path: str | Path, append: bool = False) -> int:
    """Create a new file of mode 600 in a private folder and open it for writing. Never an existing
    file (O_EXCL), nor one behind a symbolic link: FileExistsError if the name is taken."""
    path = Path(path)
    private_folder(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | (os.O_APPEND if append else 0)
    return os.open(path, flags, FILE_MODE)


def unique_path(path: str | Path) -> Path:
    """`path`, or `name-2.wav`, `name-3.wav`, ... if that is taken."""
    path = candidate = Path(path)
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def _wav_header(data_bytes: int, channels: int = CHANNELS, rate: int = SAMPLE_RATE) -> bytes:
    block_align = channels * SAMPLE_WIDTH
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + data_bytes,
        b"WAVE",
        b"fmt ",
        16,
        1,  # PCM
        channels,
        rate,
        rate * block_align,
        block_align,
        8 * SAMPLE_WIDTH,
        b"data",
        data_bytes,
    )


class WavWriter:
    """A WAV file written incrementally: the audio every 200 ms, the header kept true once a second.
    A crash loses at most the last 200 ms of audio, and `repair_wav` restores the sizes the header
    had not caught up with. Writing every 20 ms frame at once cost the media threads their clock:
    each write gives up Python's interpreter lock, and getting it back behind busy calls made 6 %
    of frames late with two browser calls in one process (bench webrtc), none with this."""

    def __init__(self, path: str | Path, channels: int = 1) -> None:
        self.path = Path(path)
        self.channels = channels
        self._fd = create_private(self.path)
        os.write(self._fd, _wav_header(0, channels))
        self._data_bytes = 0
        self._frames_since_refresh = 0
        self._pending: list[bytes] = []
        self._lock = threading.Lock()
        self._closed = False

    def append(self, pcm: bytes) -> None:
        """Append one 20 ms frame (all channels interleaved)."""
        with self._lock:
            if self._closed:
                return
            self._pending.append(pcm)
            self._data_bytes += len(pcm)
            self._frames_since_refresh += 1
            if len(self._pending) >= FLUSH_FRAMES:
                self._flush()
            if self._frames_since_refresh >= HEADER_REFRESH_FRAMES:
                self._refresh_header()

    def _flush(self) -> None:
        if self._pending:
            os.write(self._fd, b"".join(self._pending))
            self._pending.clear()

    def _refresh_header(self) -> None:
        self._flush()
        os.pwrite(self._fd, _wav_header(self._data_bytes, self.channels), 0)
        self._frames_since_refresh = 0

    @property
    def seconds(self) -> float:
        return self._data_bytes / (self.channels * SAMPLE_WIDTH * SAMPLE_RATE)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._refresh_header()
            os.fsync(self._fd)
            os.close(self._fd)
            self._closed = True


class StereoRecorder(WavWriter):
    """Writes time-aligned caller/agent frames as one interleaved stereo WAV, incrementally."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, CHANNELS)

    def write(self, caller_pcm: bytes, agent_pcm: bytes) -> None:
        """Append one 20 ms frame of each side (called from the media clock thread)."""
        if len(caller_pcm) != FRAME_BYTES or len(agent_pcm) != FRAME_BYTES:
            raise ValueError("recorder takes one 20 ms frame per side")
        inter = bytearray(2 * FRAME_BYTES)
        view = memoryview(inter).cast("h")
        view[0::2] = memoryview(caller_pcm).cast("h")
        view[1::2] = memoryview(agent_pcm).cast("h")
        self.append(bytes(inter))


def repair_wav(path: str | Path) -> bool:
    """Fix the sizes in a WAV header left stale by a killed process. Returns True if it changed."""
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER_BYTES:
        return False
    with open(path, "r+b") as f:
        head = f.read(HEADER_BYTES)
        if head[:4] != b"RIFF" or head[8:12] != b"WAVE" or head[36:40] != b"data":
            return False
        channels = struct.unpack_from("<H", head, 22)[0]
        rate = struct.unpack_from("<I", head, 24)[0]
        block = channels * SAMPLE_WIDTH
        data_bytes = (size - HEADER_BYTES) // block * block
        if struct.unpack_from("<I", head, 40)[0] == data_bytes:
            return False
        f.seek(0)
        f.write(_wav_header(data_bytes, channels, rate))
        f.truncate(HEADER_BYTES + data_bytes)
    return True


def repair_recordings(root: str | Path) -> list[Path]:
    """Repair every WAV under `root` whose header does not match its length."""
    fixed = []
    for wav in Path(root).glob("*/*.wav"):
        try:
            if repair_wav(wav):
                fixed.append(wav)
        except OSError:
            continue
    return fixed
