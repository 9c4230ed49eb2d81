"""The telephone-tuned recognizer's weights: CTranslate2 files read and written byte for byte, the
patch applied only to the base it was made for, and the torch model training uses decoding what
CTranslate2 decodes from the same weights."""

import json

import numpy as np
import pytest

from callcenter.hearing.whisper_weights import (Ct2Model, WeightsError, apply_patch, save_patch, sha256,
                                                stock_model_dir)


def test_a_model_file_is_written_back_byte_for_byte(tmp_path):
    stock = stock_model_dir() / "model.bin"
    Ct2Model.read(stock).write(tmp_path / "model.bin")
    assert sha256(tmp_path / "model.bin") == sha256(stock)


def test_a_patch_changes_its_tensors_and_only_applies_to_its_base(tmp_path):
    stock = stock_model_dir()
    base = Ct2Model.read(stock / "model.bin")
    name = "encoder/layer_norm/gamma"
    changed = base.variables[name].astype(np.float32) * 0.5
    patch = save_patch({name: changed}, tmp_path / "p.npz", {"step": 1})
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
