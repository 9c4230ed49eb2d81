"""The flow a dialled callback runs: the queue's `callback_intro`, then the queue itself, where the
call takes the place its caller left (the store keeps it). Made from the flow the caller queued in,
so the voice, the queue's agents and its hold music are the same."""

from __future__ import annotations

from callcenter.dialog.flow import Flow, QueueSettings

CALLBACK_SORRY = "I'm sorry, nobody can take your call right now. We will try again later. Goodbye."


def callback_flow(flow: Flow, queue: str) -> Flow:
    """A short flow for calling back a caller of `flow`'s `queue` (KeyError: no such queue of agents)."""
    settings = flow.queues[queue]
    if not isinstance(settings, QueueSettings):
        raise KeyError(f"{queue!r} is a SIP URI in flow {flow.name!r}, not a queue of agents")
    # a second callback key press in a callback would only end the call: off
    settings = settings.model_copy(update={"callback_key": None})
    return Flow.model_validate({
        "name": f"{flow.name}-callback", "version": flow.version, "voice": flow.voice, "ambience": flow.ambience,
        "queues": {queue: settings}, "start": "intro",
        "nodes": {"intro": {"type": "transfer", "text": settings.callback_intro, "queue": queue,
                            "on_failure": "sorry"},
                  "sorry": {"type": "hangup", "text": CALLBACK_SORRY}},
    })
