"""hibari-tts af_heart as a teacher for the source-filter SSM voice (training only).

hibari (Apache-2.0; Kokoro-82M distilled; 7.9 MB ONNX in its wheel) predicts per 12.5 ms frame the
five parts of a spectrum and F0. Its graph also knows each phoneme's duration (in 25 ms units,
before it is upsampled to frames), which is not one of its outputs: the teacher loads the graph with
that tensor (`/Cast_32_output_0`) added as an output, so every training utterance comes with exact
per-phoneme durations, no aligner needed. What the student learns per frame: F0, and the harmonic,
noise and free-phase envelopes over 0-4 kHz as DCT coefficients (`source_filter`). The phase parts
are not learnt (harmonic phase 0, free phase random: measured to cost little).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from callcenter.voice.source_filter import N_BINS, to_coefs

DURATION_TENSOR = "/Cast_32_output_0"
FRAMES_PER_UNIT = 2  # hibari's duration unit is 25 ms, two 12.5 ms frames


@dataclass
class TeacherUtterance:
    text: str
    phonemes: str
    ids: list[int]  # hibari's vocabulary, with its 0 pads at both ends
    durations: np.ndarray  # frames per id
    f0: np.ndarray  # (F,) Hz, 0 where unvoiced
    coefs: np.ndarray  # (F, 3, N_COEF): lh, ln, lr


class HibariTeacher:
    def __init__(self, voice: str = "heart"):
        import onnx
        import onnxruntime as ort
        from hibari import Hibari
        from hibari.voices import voice_path

        self.hibari = Hibari(voice=voice)
        model = onnx.load(voice_path(voice))
        model.graph.output.append(onnx.helper.make_tensor_value_info(DURATION_TENSOR, onnx.TensorProto.INT64, None))
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def phonemes(self, text: str) -> list[str]:
        return self.hibari.phonemize(text)

    def ids(self, phonemes: str) -> list[int]:
        return self.hibari.ids(phonemes)

    def utterance(self, text: str, phonemes: str) -> TeacherUtterance:
        return self.from_ids(self.ids(phonemes), text, phonemes)

    def from_ids(self, ids: list[int], text: str = "", phonemes: str = "") -> TeacherUtterance:
        """The teacher's frames for ids in its vocabulary (pads included)."""
        out = self.session.run(None, {"ids": np.asarray([ids], np.int64), "speed": np.asarray([1.0], np.float32)})
        lh, _theta, ln, lr, _phi, f0, units = out
        durations = units.astype(np.int64) * FRAMES_PER_UNIT
        frames = f0.shape[1]
        if int(durations.sum()) != frames:
            raise ValueError(f"durations sum to {durations.sum()} frames, the spectrum has {frames}")
        coefs = np.stack([to_coefs(p[0][:N_BINS]) for p in (lh, ln, lr)], axis=1)
        return TeacherUtterance(text, phonemes, ids, durations, f0[0].astype(np.float32), coefs)


def build_dataset(sentences: list[str], out: Path) -> Path:
    """Every sentence through the teacher, saved as one npz: read as the voice reads it at run time
    (`text.speech_chunks`: our number reading, sentence by sentence; then `SfVoice.g2p`, hibari's
    G2P with its guard, phrase by phrase), so the student learns the phonemes it will be given."""
    from callcenter.voice.sf_runtime import SfVoice
    from callcenter.voice.text import speech_chunks

    teacher, g2p = HibariTeacher(), SfVoice.g2p()
    utts = []
    for text in sentences:
        for chunk in speech_chunks(text):
            for ids in g2p(chunk.text) if chunk.text else []:
                utts.append(teacher.from_ids(ids, chunk.text))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        meta=np.array(json.dumps([{"text": u.text, "phonemes": u.phonemes} for u in utts])),
        ids=np.concatenate([np.asarray(u.ids, np.int16) for u in utts]),
        id_lengths=np.asarray([len(u.ids) for u in utts], np.int32),
        durations=np.concatenate([u.durations.astype(np.int16) for u in utts]),
        f0=np.concatenate([u.f0 for u in utts]).astype(np.float32),
        coefs=np.concatenate([u.coefs for u in utts]).astype(np.float16),
        frame_lengths=np.asarray([len(u.f0) for u in utts], np.int32),
    )
    return out


def load_dataset(path: Path) -> list[dict]:
    with np.load(path) as npz:  # each access to an npz member decompresses it: read each once
        z = {k: npz[k] for k in npz.files}
    out, i, f = [], 0, 0
    for n_ids, n_frames in zip(z["id_lengths"], z["frame_lengths"]):
        out.append({"ids": z["ids"][i:i + n_ids].astype(np.int64), "durations": z["durations"][i:i + n_ids].astype(np.int64),
                    "f0": z["f0"][f:f + n_frames], "coefs": z["coefs"][f:f + n_frames].astype(np.float32)})
        i += n_ids
        f += n_frames
    return out
