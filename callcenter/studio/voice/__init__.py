"""Making voices: the SSM model and its training (`model`, `ssm`, `train`), the source-filter
voices' training and cloning (`sf_model`, `sf_train`, `clone`), derived voices (`derive`), the
teachers (`teachers`, `hibari_teacher`, `kokoro_teacher`, `piper_teacher`), the text corpus and the
aligner. What they write is read at run time by `callcenter/voice/` (`sf_runtime`, `ssm_tts`)."""
