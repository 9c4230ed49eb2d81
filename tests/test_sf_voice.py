"""The source-filter SSM voice: its numpy recurrence computes what the torch model computes in
parallel, its streamed DSP equals the whole-utterance DSP, and the teacher's durations fit."""

import numpy as np
import pytest
import torch

from callcenter.studio.voice.sf_model import SfConfig, SfVoiceModel
from callcenter.voice import source_filter as sf
from callcenter.voice.sf_runtime import SfVoice, SourceFilterStream, export_sf_voice


def test_recurrent_numpy_decoder_equals_the_parallel_torch_decoder(tmp_path):
    torch.manual_seed(0)
    model = SfVoiceModel(SfConfig(dim=32, encoder_layers=2, decoder_layers=2, state=8)).eval()
    path = tmp_path / "sf.npz"
    export_sf_voice(path, model)
    voice = SfVoice(path)
    # the weights as stored (half precision) on both sides
    model.load_state_dict({k: torch.from_numpy(v).to(model.state_dict()[k].dtype) for k, v in voice.p.items()})
    ids = [0, 5, 17, 42, 9, 3, 0]
    cond = voice.plan(ids)
    with torch.no_grad():
        enc, log_dur = model.encode(torch.tensor([ids]), torch.ones(1, len(ids), 1))
        durations = torch.clamp(torch.round(torch.exp(log_dur[0]) - 1), min=0).long()
        if durations.sum() == 0:
            durations[len(ids) // 2] = 1
        torch_cond = model.condition(enc, durations[None])[0].numpy()
        assert np.allclose(cond, torch_cond, atol=1e-4)
        parallel = model.decode(torch.from_numpy(cond)[None])[0].numpy()
    recurrent = np.concatenate(list(voice.frames(cond)))
    assert recurrent.shape == parallel.shape and np.allclose(recurrent, parallel, atol=2e-3)


def test_growing_steps_compute_what_eight_frame_steps_compute(tmp_path):
    """The decoder's first step is FRAMES_PER_FIRST_STEP frames (first audio) and later ones grow
    (SECOND_STEP_FRAMES, then STEP_GROWTH times the last, to MAX_STEP_FRAMES), each scanned in
    chunks: the same recurrence, so the same outputs as eight-frame steps throughout, across step
    boundaries and a last step that is not a whole number of chunks."""
    from callcenter.voice.runtime import MAX_STEP_FRAMES, SECOND_STEP_FRAMES, STEP_GROWTH, Recurrence, scan_fn
    from callcenter.voice.sf_runtime import FRAMES_PER_FIRST_STEP

    torch.manual_seed(1)
    path = tmp_path / "sf.npz"
    export_sf_voice(path, SfVoiceModel(SfConfig(dim=32, encoder_layers=2, decoder_layers=2, state=8)).eval())
    voice = SfVoice(path)
    third = min(MAX_STEP_FRAMES, STEP_GROWTH * SECOND_STEP_FRAMES)
    steps = [FRAMES_PER_FIRST_STEP, SECOND_STEP_FRAMES, third, MAX_STEP_FRAMES, 37]
    cond = np.random.default_rng(0).standard_normal((sum(steps), 32)).astype(np.float32)
    grown = list(voice.frames(cond))
    assert [len(o) for o in grown] == steps
    net = voice.net
    eights = Recurrence(net.blocks, [scan_fn(b, 8) for b in net.blocks], net.dec_w, net.dec_b, net.head_w, net.head_b)
    same = np.concatenate([out for _, out in eights.run(cond)])
    assert np.allclose(np.concatenate(grown), same, atol=1e-4)


def test_streamed_source_filter_equals_the_whole_utterance():
    frames = 60
    f0 = np.concatenate([np.linspace(120, 180, 30), np.zeros(5), np.linspace(150, 110, 25)])
    coefs = np.zeros((frames, 3, sf.N_COEF), np.float32)
    coefs[:, 0, 0] = -2 * np.sqrt(sf.N_BINS)  # a flat harmonic envelope; no noise
    coefs[:, 1, 0] = -40 * np.sqrt(sf.N_BINS)
    # the free-phase part where voiced (it takes the pulse train's phase there, so it is not random),
    # none where unvoiced (random phase)
    coefs[:, 2, 0] = np.where(f0 > 0, -3, -40) * np.sqrt(sf.N_BINS)
    whole = sf.synthesize(coefs, f0)
    stream = SourceFilterStream()
    parts = []
    for i in range(0, frames, 8):
        stream.add(f0[i:i + 8], coefs[i:i + 8])
        parts.append(stream.samples())
        assert stream.emitted <= (i + 8) * sf.HOP
    parts.append(stream.samples(final=True))
    streamed = np.concatenate(parts)
    assert len(streamed) == len(whole) == frames * sf.HOP
    inner = slice(sf.N_FFT, len(whole) - sf.N_FFT)  # the ends differ only in padding (zeros, reflection)
    assert np.abs(whole[inner]).max() > 1e-3 and np.allclose(streamed[inner], whole[inner], atol=1e-6)


def test_the_teacher_gives_exact_durations_and_envelopes():
    pytest.importorskip("hibari")
    pytest.importorskip("onnx")
    from callcenter.studio.voice.hibari_teacher import HibariTeacher

    teacher = HibariTeacher()
    (phonemes,) = teacher.phonemes("Your balance is twelve dollars.")
    utt = teacher.utterance("Your balance is twelve dollars.", phonemes)
    assert len(utt.durations) == len(utt.ids) and utt.durations.sum() == len(utt.f0)
    assert utt.coefs.shape == (len(utt.f0), 3, sf.N_COEF) and (utt.f0 > 60).mean() > 0.3
    audio = sf.synthesize(utt.coefs, utt.f0)
    assert len(audio) == len(utt.f0) * sf.HOP and 0.005 < np.sqrt(np.mean(audio ** 2)) < 0.5


def test_a_voice_file_can_widen_its_intonation_about_its_centre(monkeypatch):
    """`f0_spread` in a voice's file (a clone's speaker's intonation range, `clone.Adapter.intonation`)
    scales every voiced frame's log F0 about `f0_centre`; voicing and envelopes are untouched."""
    from callcenter.voice.ssm_tts import SHIPPED_VOICE_DIR

    captured = []
    add = SourceFilterStream.add
    monkeypatch.setattr(SourceFilterStream, "add", lambda self, f0, coefs: (captured.append((f0, coefs)), add(self, f0, coefs)))
    voice = SfVoice(SHIPPED_VOICE_DIR / "sf-heart.npz")
    cond = voice.plan(SfVoice.g2p()("Your balance is twelve dollars and fifty cents.")[0])

    def render(**meta):
        captured.clear()
        voice.meta = {**voice.meta, **meta}
        audio = np.concatenate(list(voice.stream(cond)))
        return audio, np.concatenate([f for f, _ in captured]), np.concatenate([c for _, c in captured])

    # a trained voice (no f0_* in its file) speaks its predicted F0 exactly as predicted
    from callcenter.studio.voice.sf_model import LOG_F0_MEAN

    voice.meta = {k: v for k, v in voice.meta.items() if not k.startswith("f0_")}
    out = np.concatenate(list(voice.frames(cond)))
    plain, f0, coefs = render()
    assert np.array_equal(f0, np.where(out[:, 1] > 0, np.exp(out[:, 0] + LOG_F0_MEAN), 0.0))
    wide, f0_wide, coefs_wide = render(f0_spread=1.6, f0_centre=5.25)
    voiced = f0 > 0
    assert voiced.mean() > 0.3 and np.array_equal(voiced, f0_wide > 0) and np.array_equal(coefs, coefs_wide)
    assert np.allclose(np.log(f0_wide[voiced]) - 5.25, 1.6 * (np.log(f0[voiced]) - 5.25), atol=1e-4)
    assert len(wide) == len(plain)


def test_the_voice_says_no_where_the_text_says_no():
    """hibari's G2P reads a lowercase "no." as "number": "Please say yes or no." (the pharmacy
    flow's question) came out "yes or number". The word stays a word; "no. 5" is still a number."""
    import json
    import os

    from hibari import tts as hibari_tts

    with open(os.path.join(hibari_tts.ASSETS, "vocab.json"), encoding="utf-8") as f:
        symbol = {i: c for c, i in json.load(f).items()}
    g2p = SfVoice.g2p()

    def spoken(text):
        return " ".join("".join(symbol[i] for i in ids[1:-1]) for ids in g2p(text))

    assert spoken("Please say yes or no.") == spoken("Please say yes or no!")[:-1] + "."
    assert "mbəɹ" not in spoken("I said no. Goodbye.")
    assert "mbəɹ" in spoken("Please say yes or number.") and "mbəɹ" in spoken("Dial no. 5 now.")


def test_training_goes_on_from_a_voice_file_with_its_weights(tmp_path):
    """`sf_train --init`: a voice file (half precision) back into the torch model gives the torch
    model what the numpy voice computes."""
    from callcenter.studio.voice.sf_train import from_voice_file

    torch.manual_seed(1)
    path = tmp_path / "sf.npz"
    export_sf_voice(path, SfVoiceModel(SfConfig(dim=32, encoder_layers=2, decoder_layers=2, state=8)).eval())
    voice, model = SfVoice(path), from_voice_file(path).eval()
    assert model.config == SfConfig(dim=32, encoder_layers=2, decoder_layers=2, state=8)
    cond = voice.plan([0, 5, 17, 42, 9, 3, 0])
    with torch.no_grad():
        parallel = model.decode(torch.from_numpy(cond)[None])[0].numpy()
    assert np.allclose(np.concatenate(list(voice.frames(cond))), parallel, atol=2e-3)


def test_the_teacher_reads_training_text_as_the_voice_reads_it_on_a_call(tmp_path):
    """The student learns from the phonemes it is given at run time: our number reading and
    sentence split (`speech_chunks`), then the voice's G2P with its guard, phrase by phrase."""
    pytest.importorskip("onnx")
    from callcenter.studio.voice.hibari_teacher import build_dataset, load_dataset
    from callcenter.voice.text import speech_chunks

    text = "Your bill is $54.28, due 2026-03-01. Please say yes or no."
    data = load_dataset(build_dataset([text], tmp_path / "teacher.npz"))
    g2p = SfVoice.g2p()
    spoken = [ids for chunk in speech_chunks(text) for ids in g2p(chunk.text)]
    assert [list(u["ids"]) for u in data] == spoken and len(spoken) >= 2
    assert all(u["durations"].sum() == len(u["f0"]) == len(u["coefs"]) for u in data)
