"""One call: the pipeline of stages, its events, its recording."""
