"""Card numbers and other sensitive values (PCI DSS): what the caller says while giving one is
masked wherever it is stored, and the caller's side of the recording is silent meanwhile and for a
moment after."""

from __future__ import annotations

import asyncio

from callcenter.dialog.redact import mask_spoken_digits

PRIVATE_TAIL_S = 1.5  # the caller's side stays out of the recording this long after a card number is taken


class Privacy:
    def __init__(self, call):
        self.call = call
        self._off: asyncio.TimerHandle | None = None
        self.turn_private = False  # the caller's current turn began while they gave a sensitive value

    def begin_turn(self) -> None:
        self.turn_private = self.call.bridge.private_caller or self.call.dialog.collecting_sensitive

    def shown(self, text: str, private: bool = False) -> str:
        """What the caller said, as it may be stored: masked while they give a sensitive value, and
        in a turn that began then (a caller still reading out digits after the value was taken)."""
        if private or self.turn_private or self.call.dialog.collecting_sensitive:
            return mask_spoken_digits(text)
        return text

    def guard(self) -> None:
        """Silence the caller's side of the recording while the flow collects a sensitive value,
        and for PRIVATE_TAIL_S after (a keypad tone or a last word still on the line)."""
        bridge, dialog = self.call.bridge, self.call.dialog
        if dialog.collecting_sensitive:
            if self._off is not None:
                self._off.cancel()
                self._off = None
            bridge.private_caller = True
        elif bridge.private_caller and self._off is None:
            def off() -> None:
                self._off = None
                if dialog.collecting_sensitive:
                    return
                if self.turn_private and self.call.hearing.listener.in_speech:  # still reading digits out: wait
                    self._off = asyncio.get_running_loop().call_later(PRIVATE_TAIL_S, off)
                    return
                bridge.private_caller = False

            self._off = asyncio.get_running_loop().call_later(PRIVATE_TAIL_S, off)
