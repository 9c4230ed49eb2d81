"""Dialog: the flow model authors write in YAML, its checker, the intent matcher and the engine."""
