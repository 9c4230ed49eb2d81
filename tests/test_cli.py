"""Bad input gets a clear one-line error and a non-zero exit, never a traceback."""

import json
import socket
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FLOW, free_udp_port


def cc(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "callcenter.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def test_flows_check_ok_and_typo(tmp_path):
    assert cc("flows", "check", FLOW).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(FLOW.read_text().replace("next: main_menu", "next: main_menuu", 1))
    r = cc("flows", "check", bad)
    assert r.returncode == 1 and f"{bad}:" in r.stdout and "unknown node 'main_menuu'" in r.stdout


def test_serve_with_missing_or_invalid_config(tmp_path):
    r = cc("serve", "--config", tmp_path / "nope.yaml")
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text("listen: {port: seventy}\n")
    r = cc("serve", "--config", cfg)
    assert r.returncode == 2 and f"{cfg}:1:" in r.stderr and "listen.port" in r.stderr


def test_serve_on_a_port_in_use(tmp_path):
    port = free_udp_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"listen: {{host: 127.0.0.1, port: {port}}}\nrecordings: {tmp_path / 'rec'}\n")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", port))
        r = cc("serve", "--config", cfg, "--flow", FLOW)
    assert r.returncode != 0
    assert f"cannot listen for SIP on udp 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


def test_transcribe_resamples_a_44k_stereo_wav(tmp_path, caller_voice):
    from callcenter.audio.wavfile import read_wav

    pcm = np.frombuffer(read_wav(caller_voice("bill", "I have a question about my bill"), rate=44100), "<i2")
    path = tmp_path / "hi.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(44100)
        w.writeframes(np.stack([pcm, pcm], axis=1).tobytes())
    r = cc("transcribe", path)
    assert r.returncode == 0 and "bill" in r.stdout.lower()


def test_transcribe_garbage_file(tmp_path):
    p = tmp_path / "x.wav"
    p.write_bytes(b"RIFF0000garbage")
    r = cc("transcribe", p)
    assert r.returncode == 2 and "not a WAV file" in r.stderr


def test_transcribe_reads_every_encoding_and_refuses_what_is_not_audio(tmp_path, caller_voice):
    import shutil
    import subprocess

    if not shutil.which("sox"):
        pytest.skip("sox is not installed")
    bill = caller_voice("bill", "I have a question about my bill")
    files = []
    for name, args in (("ulaw", ["-e", "mu-law"]), ("alaw", ["-e", "a-law"]), ("f32", ["-e", "floating-point", "-b", "32"]),
                       ("s24", ["-b", "24", "-r", "48000"])):
        files.append(tmp_path / f"{name}.wav")
        subprocess.run(["sox", str(bill), *args, str(files[-1])], check=True)
    r = cc("transcribe", *files)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4 and all("bill" in line.lower() for line in lines), r.stdout
    # a header and no audio, a text file, an empty file: one clear line each, no transcript
    header_only = tmp_path / "empty.wav"
    subprocess.run(["sox", str(bill), str(header_only), "trim", "0", "0"], check=True)
    text = tmp_path / "notes.wav"
    text.write_text("call Dana back about the refund\n")
    empty = tmp_path / "zero.wav"
    empty.write_bytes(b"")
    for path, words in ((header_only, "holds no audio"), (text, "not a WAV file"), (empty, "empty file")):
        r = cc("transcribe", path)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stdout == ""


def test_transcribe_a_long_recording_in_timed_pieces(tmp_path, caller_voice):
    from callcenter.audio.wavfile import read_wav, write_wav

    lines = ["I have a question about my bill", "The modem shows no signal since Monday",
             "Please send a technician on Thursday morning"]
    pcm = b"".join(read_wav(caller_voice(f"long{i}", text)) + bytes(8000) for i, text in enumerate(lines)) * 4
    path = tmp_path / "long.wav"
    write_wav(path, pcm)
    r = cc("transcribe", path)
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip().splitlines()
    assert out[0].startswith(f"{path}: ") and " pieces" in out[0]
    pieces = out[1:]
    assert len(pieces) >= 2 and all(p.startswith("[") for p in pieces)
    heard = " ".join(pieces).lower()
    assert heard.count("bill") >= 3 and heard.count("thursday") >= 3, heard  # nothing cut off at the end
    assert pieces[-1].split("]")[0].endswith(f"{len(pcm) / 16000 % 60:04.1f}")


def test_say_nothing_and_demo_outside_the_repository(tmp_path):
    r = cc("say", "  ", "--out", tmp_path / "x.wav")
    assert r.returncode == 2 and "nothing to say" in r.stderr and not (tmp_path / "x.wav").exists()
    r = subprocess.run([sys.executable, "-m", "callcenter.cli", "demo"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=60)
    assert r.returncode == 2 and "run the demo from the repository" in r.stderr and "Traceback" not in r.stderr


def test_simulate_unknown_caller_step(tmp_path):
    r = cc("simulate", "--flow", FLOW, "--caller", "dtmf:99", "--out", tmp_path)
    assert r.returncode == 2 and "dtmf:" in r.stderr


@pytest.mark.slow
def test_say_writes_8k_audio(tmp_path):
    r = cc("say", "Your account number is four seven two.", "--out", tmp_path / "s.wav")
    assert r.returncode == 0
    with wave.open(str(tmp_path / "s.wav")) as w:
        assert w.getframerate() == 8000 and w.getnframes() > 8000


@pytest.mark.slow
def test_say_with_each_voice_and_controls(tmp_path):
    for voice in ("ssm:joe", "ssm:awb", "ssm:slt", "ssm:heart", "ssm:reed", "espeak:en-gb-scotland"):
        out = tmp_path / f"{voice.replace(':', '-')}.wav"
        r = cc("say", "Your balance is $12.50.", "--voice", voice, "--speed", "1.1", "--pitch", "2",
               "--ambience", "office", "--out", out)
        assert r.returncode == 0, r.stderr
    r = cc("say", "Hello", "--voice", "ssm:nobody", "--out", tmp_path / "x.wav")
    assert r.returncode == 2 and "unknown voice 'ssm:nobody'" in r.stderr
    r = cc("say", "Hello", "--speed", "9", "--out", tmp_path / "x.wav")
    assert r.returncode == 2 and "speed" in r.stderr and "Traceback" not in r.stderr


def test_voice_list_names_the_voices_and_teachers():
    r = cc("voice", "list")
    assert r.returncode == 0
    assert "ssm:joe\t(learnt from piper:joe)" in r.stdout
    for voice in ("slt", "awb"):  # source-filter clones of flite's speakers, listed once
        assert f"ssm:{voice}\t(cloned from flite's {voice} voice (CMU ARCTIC speaker {voice}" in r.stdout
        assert r.stdout.count(f"ssm:{voice}\t") == 1
    assert "ssm:heart\t(learnt from hibari:heart)" in r.stdout
    assert "ssm:kumo\t(learnt from kokoro:jm_kumo" in r.stdout
    assert "ssm:reed\t(ssm:heart at -10 semitones, formants x0.84" in r.stdout


@pytest.mark.slow
@pytest.mark.slow
def test_bench_tts_measures_hibari_beside_ours_in_the_same_run(tmp_path):
    out = tmp_path / "tts.json"
    r = cc("bench", "tts", "--sentences", "2", "--voices", "joe", "--json", out, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    joe = report["voices"]["ssm:joe"]  # our voice's own measures
    assert joe["first_audio_ms_p50"] > 0 and 0 < joe["rtf_median"] < 1 and 0 <= joe["wer"] < 0.5
    assert 1.0 <= joe["dnsmos"]["OVRL"] <= 5.0 and 1.0 <= joe["dnsmos"]["SIG"] <= 5.0
    assert report["memory"]["voices_in_file"] == 3
    hibari = report["references"]["hibari af_heart"]
    assert hibari["wer"] < 0.2 and hibari["dnsmos"]["OVRL"] > 2.5 and 0 < hibari["rtf_median"] < 0.5
    kumo = report["references"]["kokoro jm_kumo (teacher)"]  # ssm:kumo's teacher, said as our voices read
    assert kumo["wer"] < 0.3 and kumo["dnsmos"]["OVRL"] > 2.5
    vs = report["voices"]["ssm:joe"]["vs_hibari"]
    assert vs["wer_ratio"] >= 0 and vs["rtf_ratio"] > 0 and -4 < vs["dnsmos_ovrl_diff"] < 4
    # and timed against hibari in back-to-back pairs, the measure the RTF target is judged by
    assert 0 < vs["rtf_ratio_paired"] == report["voices"]["ssm:joe"]["rtf_ratio_paired"] < 100
    # issue 17's targets, each met or missed by this run's own figures
    rows = {(t["target"], t["voice"]): t for t in report["targets"]}
    ovrl = rows[("DNSMOS OVRL >= 2.9", "ssm:joe")]
    assert ovrl["value"] == report["voices"]["ssm:joe"]["dnsmos"]["OVRL"] and ovrl["met"] == (ovrl["value"] >= 2.9)
    weights = rows[("all shipped voices <= 20 MB", None)]
    assert 10 < weights["value"] == report["memory"]["shipped_weights_mb"] and weights["met"]


@pytest.mark.slow
@pytest.mark.skipif(not Path("../shared/eval/manifest.jsonl").exists(), reason="needs ../shared/eval")
def test_bench_stt_reports_each_condition_raw_and_gated(tmp_path):
    out = tmp_path / "stt.json"
    r = cc("bench", "stt", "--limit", "2", "--json", out, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    conditions = report["conditions"]
    assert {"clean", "white10", "babble10"} <= set(conditions)
    assert {"raw", "denoised"} == set(conditions["white10"])
    assert conditions["white10"]["denoised"]["denoise_ms_per_frame_p50"] > 0
    clean = report["latency"]["clean/answer_recognised"]
    assert 0 < clean["final_ms_p50"] < 2000 and clean["cpu_per_call_second"] > 0
    assert report["latency"]["clean/open_question"]["turn_end_ms_p50"] >= clean["turn_end_ms_p50"]
    assert report["bargein"]["agent_turns"] == 2 and "missed_rate" in report["bargein"]["interruptions_babble10"]
    assert set(report["digits"]) >= {"clean/hint", "white10/hint", "babble10/hint"}
    soft = report["soft"]  # 2 utterances, each in 3 babbles, the last word softer and at level
    assert soft["cases"] == 6 and 0 <= soft["last_word_heard"] <= 1 and 0 <= soft["last_word_heard_at_level"] <= 1
    assert len(soft["misses"]) == round(6 * (1 - soft["last_word_heard"]))
    assert all(m["said"] and m["babble"] in (1, 2, 3) for m in soft["misses"])


def test_bench_stt_rejects_unknown_parts(tmp_path):
    r = cc("bench", "stt", "--parts", "wer,speed", "--json", tmp_path / "x.json")
    assert r.returncode == 2 and "unknown speed" in r.stderr


def test_bench_nlu_reports_embeddings_against_words_alone(tmp_path):
    out = tmp_path / "nlu.json"
    r = cc("bench", "nlu", "--json", out)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    words, semantic = report["words_only"], report["words_then_embeddings"]
    assert words["sentences"] == semantic["sentences"] >= 40
    assert semantic["right"] > words["right"] and semantic["wrong_intent"] <= 0.05
    assert semantic["out_of_scope_rejected"] >= 0.8
