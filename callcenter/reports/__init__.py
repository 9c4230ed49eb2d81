"""Reports from the store: the figures of a period (`figures.py`) and their CSV, JSON and HTML with
plots (`render.py`), for `callcenter report`."""
