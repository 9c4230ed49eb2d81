"""callcenter: a telephony contact-center agent that runs on one ordinary machine."""

__version__ = "0.1.0"
