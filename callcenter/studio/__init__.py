"""The training wing: what makes and measures the models the run time uses. The voices' training,
cloning and derivation, their teachers, corpus and aligner live here (`studio/voice/`); the
recognizer's training is in `lab/stt_train.py`. `serve` never imports this package
(`tests/test_layers.py` checks it): torch and the teachers stay out of the call server."""
