"""Outbound campaigns: the campaign file and its contacts (`model.py`), and the dialer that works through them (`dialer.py`)."""
