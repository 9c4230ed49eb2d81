"""The one base of every error callcenter raises on purpose. Each says what went wrong in words a
user can act on; the command line prints it and exits with 2 instead of a traceback."""


class CallcenterError(Exception):
    pass
