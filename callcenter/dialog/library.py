"""Hot reload: the flow file a server answers with, re-read when it changes.

New calls get the newest valid version; calls in progress keep the `Flow` object they started with,
so they finish on that version. An edit that does not pass the checker is rejected: the errors are
logged (and kept in `errors` for the supervisor) and the running version stays.

The file is checked off the event loop, and `prepare(flow)` (the server renders the new version's
line noise there) runs before the new version is taken, so no call waits on a reload. `on_reload`
is told of each new version once it is current (the server warms its prompts).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import structlog

from callcenter.dialog.flow import Flow, load_flow
from callcenter.yamlfile import UserFileError

log = structlog.get_logger()

POLL_S = 1.0


class FlowLibrary:
    def __init__(self, path: str | Path, prepare: Callable[[Flow], object] | None = None):
        self.path = Path(path)
        self.prepare = prepare
        self.on_reload: Callable[[Flow], object] | None = None
        self.current: Flow = load_flow(self.path)  # the first version must be valid: serve refuses to start
        self._stamp = self._stat()
        self.digest = self._digest()
        self.errors: list[str] = []
        self.reloads = 0

    def _files(self) -> list[Path]:
        """The flow file and every sub-flow file the running version uses."""
        return list(self.current.sources) or [self.path]

    def _stat(self) -> tuple | None:
        try:
            return tuple((st.st_mtime_ns, st.st_size) for st in (f.stat() for f in self._files()))
        except OSError:
            return None

    def _digest(self) -> str:
        try:
            h = hashlib.sha256()
            for f in self._files():
                h.update(f.read_bytes())
            return h.hexdigest()[:12]
        except OSError:
            return ""

    def poll(self) -> bool:
        """Check the file; True when a new version was taken."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        digest = self._digest()
        if not digest:
            return False
        if digest == self.digest:  # back to the running version (a rejected edit undone)
            if self.errors:
                log.info("flow_edit_reverted", path=str(self.path), running_version=self.current.version)
                self.errors = []
            return False
        try:
            flow = load_flow(self.path)
        except UserFileError as exc:
            if exc.problems != self.errors:
                log.error("flow_rejected", path=str(self.path), problems=exc.problems,
                          running_version=self.current.version, running_digest=self.digest)
            self.errors = exc.problems
            return False
        if self.prepare is not None:
            try:
                self.prepare(flow)
            except Exception:  # the version is valid; what could not be made ahead is made by its first call
                log.exception("flow_prepare_failed", path=str(self.path), version=flow.version)
        self.current, self.errors = flow, []
        self._stamp, self.digest = self._stat(), self._digest()  # the new version may use other files
        self.reloads += 1
        log.info("flow_reloaded", path=str(self.path), flow=flow.name, version=flow.version, digest=digest)
        return True

    async def watch(self, interval: float = POLL_S) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                if await asyncio.to_thread(self.poll) and self.on_reload is not None:
                    self.on_reload(self.current)
            except Exception:  # a watcher that dies would freeze the flow silently
                log.exception("flow_watch_failed", path=str(self.path))
