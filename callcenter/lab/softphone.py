"""A real SIP softphone (baresip, headless) that places calls to the agent: used by the demo, the
tests and `callcenter bench call`. The caller's microphone is a WAV file (the call lasts as long as
the file); what the caller hears is dumped to `dump-*-dec.wav` in the work directory."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from callcenter.audio.frames import SAMPLE_RATE
from callcenter.audio.wavfile import read_wav, write_wav
from callcenter.errors import CallcenterError
from callcenter.voice.flite import flite_voice

BARESIP_MODULES = ("stdio", "g711", "aufile", "aubridge", "sndfile", "account", "menu")
MODULE_DIRS = ("/usr/lib/baresip/modules", "/usr/lib/x86_64-linux-gnu/baresip/modules",
               "/usr/lib/aarch64-linux-gnu/baresip/modules", "/usr/local/lib/baresip/modules")


class SoftphoneError(CallcenterError, RuntimeError):
    pass


def _module_dir() -> str:
    for d in MODULE_DIRS:
        if Path(d, "g711.so").exists():
            return d
    raise SoftphoneError("baresip modules not found (apt-get install baresip-core)")


def scripted_caller(lines: tuple[str, ...] | list[str], workdir: Path, lead_s: float, gap_s: float,
                    tail_s: float) -> Path:
    """The microphone of a caller who says `lines` in turn, built with flite_voice + caller_audio."""
    wavs = [flite_voice(text, Path(workdir) / f"line{i}.wav") for i, text in enumerate(lines)]
    return caller_audio(wavs, Path(workdir) / "mic.wav", lead_s, gap_s, tail_s)


def caller_audio(speech_wavs: list[Path], out: Path, lead_s: float, gap_s: float, tail_s: float) -> Path:
    """Build the caller's microphone: silence, each utterance separated by gaps, silence at the end."""
    parts = [bytes(int(lead_s * SAMPLE_RATE) * 2)]
    for i, wav in enumerate(speech_wavs):
        parts.append(read_wav(wav))
        parts.append(bytes(int((gap_s if i < len(speech_wavs) - 1 else tail_s) * SAMPLE_RATE) * 2))
    write_wav(out, b"".join(parts))
    return out


class Softphone:
    """One baresip process placing one call."""

    def __init__(self, workdir: Path, mic_wav: Path, user: str = "caller", registrar: str | None = None,
                 password: str | None = None, answer: bool = True, port: int = 0, host: str = "127.0.0.1"):
        """A caller's phone, or with `registrar` (host:port) a human agent's: it registers there as
        `user` (digest `password`) and answers every call at once (`answer=False`: lets it ring).
        With `port` (and no registrar) it listens there and answers calls to sip:USER@HOST:PORT; `host`
        is the address it sends and listens from."""
        if not shutil.which("baresip"):
            raise SoftphoneError("baresip is not installed (apt-get install baresip-core)")
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        mods = "\n".join(f"module {m}.so" for m in BARESIP_MODULES)
        (self.dir / "config").write_text(
            f"poll_method epoll\nsip_listen {host}:{port}\naudio_player aubridge,nil\n"
            f"audio_source aufile,{Path(mic_wav).resolve()}\naudio_alert aubridge,nil\n"
            f"net_interface {host}\nmodule_path {_module_dir()}\n{mods}\nsnd_path {self.dir.resolve()}\n"
        )
        if registrar:
            (self.dir / "accounts").write_text(
                f"<sip:{user}@{registrar}>;auth_pass={password};answermode={'auto' if answer else 'manual'};"
                f"regint=600\n")
        else:
            (self.dir / "accounts").write_text(f"<sip:{user}@{host}>;regint=0"
                                               f"{';answermode=auto' if port and answer else ''}\n")
        self.uri = f"sip:{user}@{host}:{port}" if port else None
        self.log_path = self.dir / "baresip.log"
        self.proc: subprocess.Popen | None = None
        self.dialed_at: float | None = None

    def start(self) -> "Softphone":
        """Run the phone without dialling (an agent's phone, waiting for calls)."""
        self.proc = subprocess.Popen(
            ["baresip", "-f", str(self.dir)], stdin=subprocess.PIPE, stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT, cwd=self.dir,
        )
        self._wait_log("baresip is ready", 10)
        return self

    def wait_registered(self, timeout: float = 10) -> bool:
        return self._wait_log("200 OK", timeout)

    def calls_answered(self) -> int:
        return self.log().count("Call established")

    def received_wavs(self) -> list[Path]:
        """What this phone heard, one file per call."""
        return sorted(self.dir.glob("dump-*-dec.wav"))

    def dial(self, uri: str) -> None:
        self.proc = subprocess.Popen(
            ["baresip", "-f", str(self.dir)], stdin=subprocess.PIPE, stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT, cwd=self.dir,
        )
        self._wait_log("baresip is ready", 10)
        self.dialed_at = time.monotonic()
        self.send(f"/dial {uri}")

    def send(self, line: str) -> None:
        assert self.proc and self.proc.stdin
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def press(self, digits: str) -> None:
        """Keypad digits, sent as RFC 4733 telephone events."""
        for d in digits:
            self.send(d)
            time.sleep(0.3)

    def hangup(self) -> None:
        self.send("/hangup")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _wait_log(self, needle: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return True
            if self.proc and self.proc.poll() is not None:
                break
            time.sleep(0.05)
        return False

    def wait_established(self, timeout: float = 10) -> bool:
        return self._wait_log("Call established", timeout)

    def wait_ended(self, timeout: float = 120) -> bool:
        return self._wait_log("terminated", timeout) or self._wait_log("Call failed", 0.1)

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.send("/quit")
                self.proc.wait(5)
            except Exception:
                self.proc.kill()
                self.proc.wait()

    def received_wav(self) -> Path | None:
        """The audio this caller heard (written by baresip's sndfile module)."""
        found = sorted(self.dir.glob("dump-*-dec.wav"))
        return found[-1] if found else None

    def __enter__(self) -> "Softphone":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
