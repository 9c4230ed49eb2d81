"""What a call is doing, in one word, and who drives it: the precedence of the call's parts in one
place (a person bridged in beats a supervisor, who beats a queue, a transfer, a voicemail, the
agent's voice, and the flow's wait for the caller)."""

from __future__ import annotations

from enum import StrEnum

from callcenter.dialog.engine import Waiting


class CallState(StrEnum):
    LISTENING = "listening"
    WORKING = "working"  # the flow waits on a webhook or a model
    TALKING = "talking"
    TRANSFERRING = "transferring"
    QUEUED = "queued"
    VOICEMAIL = "voicemail"
    BRIDGED = "bridged"
    PAUSED = "paused"
    TAKEN_OVER = "taken over"
    ENDED = "ended"


class Driver(StrEnum):
    """Who has the call: the flow, a supervisor, or a person it was put through to."""
    FLOW = "flow"
    SUPERVISOR = "supervisor"
    PERSON = "person"


def call_state(call) -> CallState:
    if call.ended.is_set():
        return CallState.ENDED
    if call.bridged:
        return CallState.BRIDGED
    if call.features.supervision.paused:
        return CallState.PAUSED
    if call.features.supervision.held:
        return CallState.TAKEN_OVER
    if call.features.queue.wait is not None:
        return CallState.QUEUED
    if call.dialog.waiting == Waiting.TRANSFER:
        return CallState.TRANSFERRING
    if call.features.voicemail.recording:
        return CallState.VOICEMAIL
    if call.speaking.speaking:
        return CallState.TALKING
    return CallState.LISTENING if call.dialog.waiting == Waiting.CALLER else CallState.WORKING


def driver(call) -> Driver:
    if call.bridged:
        return Driver.PERSON
    if call.features.supervision.held:
        return Driver.SUPERVISOR
    return Driver.FLOW
