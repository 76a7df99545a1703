"""A followed log (docs/api.md, "Log follow"): binary messages of whole
lines (CRI records, or the network log's JSON lines), then one text
message ``{"type":"end",...}`` once the sandbox has finished."""

from __future__ import annotations

import json
from typing import Any, Generic, Iterator, Optional, TypeVar

from ._websocket import WebSocket
from .errors import ConnectionFailed
from .models import LogEnd, LogRecord

T = TypeVar("T")


def parse_network_line(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return {"line": line}


class LogFollow(Generic[T]):
    """Iterate for the records as they are written (:class:`LogRecord`, or
    a dict per network-log line). The iteration ends when the sandbox has
    finished (``end`` then says how) or when ``close()`` is called; use it
    as a context manager to close it."""

    def __init__(self, ws: WebSocket, network: bool) -> None:
        self._ws = ws
        self._network = network
        self._carry = ""
        self.end: Optional[LogEnd] = None

    def _item(self, line: str) -> Any:
        return parse_network_line(line) if self._network else LogRecord.parse(line)

    def __iter__(self) -> Iterator[T]:
        try:
            while True:
                message = self._ws.recv()
                if message is None:
                    break
                if isinstance(message, bytes):
                    text = self._carry + message.decode("utf-8", "replace")
                    lines = text.split("\n")
                    self._carry = lines.pop()
                    for line in lines:
                        yield self._item(line)
                    continue
                try:
                    m = json.loads(message)
                except ValueError:
                    continue
                if isinstance(m, dict) and m.get("type") == "end":
                    code = m.get("exit_code")
                    self.end = LogEnd(str(m.get("phase", "")),
                                      int(code) if code is not None else None)
                    break
            if self._carry:
                yield self._item(self._carry)
                self._carry = ""
        finally:
            if self.end is not None:
                self._ws.close()  # the server's close is answered
            else:
                self._ws.abort()
        if self.end is None and not self._stopped:
            raise ConnectionFailed("the log stream ended early")

    _stopped = False

    def close(self) -> None:
        """Stops following; may be called from another thread while one
        iterates (its iteration then ends)."""
        self._stopped = True
        if not self._ws.closed:
            self._ws.stop()

    def __enter__(self) -> "LogFollow[T]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        self._ws.abort()
