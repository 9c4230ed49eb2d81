"""What a call can do besides hearing, deciding and speaking, each a small part the conductor
(`call/session.py`) plugs in: a transfer, a wait in a queue, a voicemail, a supervisor's controls,
the privacy of card numbers, a dialled call's answering-machine detection. A new feature is a new file here, not more lines in the session."""

from __future__ import annotations

from callcenter.call.features.answering_machine import AnsweringMachine
from callcenter.call.features.privacy import Privacy
from callcenter.call.features.queue_wait import QueueWaiting
from callcenter.call.features.supervisor import Supervision
from callcenter.call.features.transfer import Transferring
from callcenter.call.features.trouble import Trouble
from callcenter.call.features.voicemail import Voicemail


class Features:
    """The features one call has, each built with the call it serves."""

    def __init__(self, call):
        self.privacy = Privacy(call)
        self.voicemail = Voicemail(call)
        self.queue = QueueWaiting(call)
        self.transfer = Transferring(call)
        self.supervision = Supervision(call)
        self.trouble = Trouble(call)
        self.machine = AnsweringMachine(call)
