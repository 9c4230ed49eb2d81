"""After the call: a summary, categories and sentiment from the call's events and row
(`summary.py`), an end-of-call webhook, signed and retried (`webhook.py`), and the post-call worker
that does both off the media path, one call at a time (`worker.py`)."""
