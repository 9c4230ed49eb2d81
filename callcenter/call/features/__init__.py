"""What a call can do besides hearing, deciding and speaking, each a small part the conductor
(`call/session.py`) plugs in: a transfer, a wait in a queue, a voicemail, a supervisor's controls,
the privacy of card numbers. A new feature is a new file here, not more lines in the session."""
