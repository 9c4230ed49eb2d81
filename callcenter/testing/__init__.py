"""Fakes for fast tests of a call's parts and features, and a harness that runs a whole call on
the virtual clock with them: a voice that says each word as a few frames of tone, a line that
records transfers and hang-ups (`SimulatedLine`), and a caller who speaks in text (what the
recognizer would have heard). The real whole-call tests (`simulate_call`, real SIP) stay the
end-to-end checks; these are for features, in well under a second each."""

from callcenter.testing.harness import CallHarness, FakeRecognizer, FakeVoice, run_call

__all__ = ["CallHarness", "FakeRecognizer", "FakeVoice", "run_call"]
