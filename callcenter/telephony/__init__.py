"""Telephony: SIP lines through pjsua2 (and, later, WebRTC)."""
