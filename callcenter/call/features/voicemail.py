"""Leaving a message: a beep, then the caller's audio until # / silence / the maximum length; what
is heard meanwhile is recorded, not answered."""

from __future__ import annotations

from callcenter.call import events as ev
from callcenter.call.state import CallState
from callcenter.call.voicemail import VoicemailRecorder, beep_frames, voicemail_path
from callcenter.dialog.engine import Record


class Voicemail:
    def __init__(self, call):
        self.call = call
        self.recorder: VoicemailRecorder | None = None

    @property
    def recording(self) -> bool:
        return self.recorder is not None

    async def record(self, action: Record) -> None:
        call = self.call
        if action.beep:
            beep = call.speaking.new_speech("(beep)")
            for i, frame in enumerate(beep_frames()):
                call.bridge.play(frame, beep.id, first=i == 0)
            call.bridge.end_utterance(beep.id)
            await beep.played
        path = voicemail_path(call.events.path, call.call_id)
        self.recorder = VoicemailRecorder(path, action.max_s, action.end_silence_s)
        call.status.enter(CallState.VOICEMAIL)
        call.events.emit(ev.VOICEMAIL, state="recording", path=str(path) if path else None)
        try:
            reason = await self.recorder.done()
        finally:
            recorder, self.recorder = self.recorder, None
            call.status.leave(CallState.VOICEMAIL)
            seconds = recorder.close()
        if not recorder.heard_speech:  # the file is kept, but the flow learns that nothing was said
            reason, seconds = "nothing said", 0.0
        call.events.emit(ev.VOICEMAIL, state="saved", path=str(path) if path else None, seconds=round(seconds, 2),
                         ended_by=reason)
        await call.runner.decide(lambda: call.dialog.on_recorded(str(path) if path else None, seconds),
                                 caller_input=False)
