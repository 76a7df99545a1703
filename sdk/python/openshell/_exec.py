"""Exec: a command in a sandbox over the exec WebSocket (docs/api.md,
"Exec"). The client sends a ``start`` message, stdin as binary messages and
``eof``; the server sends ``started``, output as binary messages whose first
byte names the stream (1 stdout, 2 stderr), and last ``exit`` or ``error``."""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
from typing import (IO, Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

from ._websocket import WebSocket
from .errors import ConnectionFailed, ExecError, ExecTimeout, OpenShellError, ProtocolError
from .models import ExecOutput

#: What stdin may be: bytes or text (sent whole, then end of input), a
#: binary file (read and sent as it comes), an iterable of bytes or str
#: chunks (sent as they come, from a thread), or None.
Stdin = Union[bytes, bytearray, memoryview, str, IO[bytes], Iterable[Union[bytes, str]], None]
Env = Union[Mapping[str, str], Sequence[str], None]

_STREAMS = {1: "stdout", 2: "stderr"}
_EOF = json.dumps({"type": "eof"})
_CHUNK = 65536
SIGKILL = 9


# The upgrade request's field for the start message (percent-encoded JSON;
# docs/api.md), and its longest value: a longer one goes as a message.
START_HEADER = "Openshell-Exec-Start"
START_HEADER_MAX = 8192


def start_message(argv: Sequence[str], env: Env, workdir: Optional[str], user: Optional[str],
                  tty: bool, rows: int, cols: int) -> str:
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a list of strings, not a single string "
                        "(use ['sh', '-c', CMD] for a shell command)")
    start: Dict[str, Any] = {"type": "start", "argv": [str(a) for a in argv],
                             "env": env_entries(env), "tty": bool(tty)}
    if tty:
        start["rows"] = int(rows)
        start["cols"] = int(cols)
    if workdir is not None:
        start["workdir"] = workdir
    if user is not None:
        start["user"] = str(user)
    return json.dumps(start)


def env_entries(env: Env) -> List[str]:
    if env is None:
        return []
    if isinstance(env, Mapping):
        return ["%s=%s" % (k, v) for k, v in env.items()]
    if isinstance(env, (str, bytes)):
        raise TypeError("env must be a mapping or a list of 'KEY=VALUE' strings")
    entries = [str(e) for e in env]
    for e in entries:
        if "=" not in e:
            raise ValueError("env entry %r: expected KEY=VALUE" % e)
    return entries


class ExecStream:
    """A running command. Iterate over it for its output
    (:class:`ExecOutput` chunks, as they arrive); the iteration ends when
    the command has exited, and ``exit_code`` then holds its status. Use it
    as a context manager: leaving the block closes the stream, which kills a
    command still running (SIGKILL).

    ``send``, ``close_stdin``, ``signal`` and ``resize`` may be called from
    any thread while another iterates."""

    def __init__(self, ws: WebSocket, start: Optional[str], stdin: Stdin = None,
                 timeout: Optional[float] = None) -> None:
        self._ws = ws
        self.exit_code: Optional[int] = None
        self.started = False
        self.timed_out = False
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout if timeout is not None else None
        self._error: Optional[OpenShellError] = None
        self._done = False
        self._stdin_closed = False
        self._feeder: Optional[threading.Thread] = None
        self._early: Deque[ExecOutput] = collections.deque()  # read by wait_started
        self._resize_lock = threading.Lock()
        self._pending_resize: Optional[str] = None
        # The start (unless the upgrade request carried it), and stdin when
        # it is already whole, in one write.
        first: List[Union[str, bytes]] = [start] if start is not None else []
        if isinstance(stdin, str):
            stdin = stdin.encode("utf-8")
        if isinstance(stdin, (bytes, bytearray, memoryview)):
            data = bytes(stdin)
            first.extend(data[i:i + _CHUNK] for i in range(0, len(data), _CHUNK))
            first.append(_EOF)
            self._stdin_closed = True
        if first:
            ws.send_messages(first)
        if stdin is not None and not self._stdin_closed:
            self._feeder = threading.Thread(target=self._feed, args=(stdin,),
                                            name="openshell-exec-stdin", daemon=True)
            self._feeder.start()

    @property
    def finished(self) -> bool:
        """Whether the command's end (or the stream's) has been read."""
        return self._done

    # Input.

    def send(self, data: Union[bytes, str]) -> None:
        """Bytes (or text, as UTF-8) for the command's standard input."""
        if self._stdin_closed:
            raise OpenShellError("exec: stdin is already closed", code="exec")
        if isinstance(data, str):
            data = data.encode("utf-8")
        data = bytes(data)
        for i in range(0, len(data), _CHUNK):
            self._ws.send_binary(data[i:i + _CHUNK])

    def close_stdin(self) -> None:
        """End of input (with a tty, the terminal's ^D)."""
        if not self._stdin_closed:
            self._stdin_closed = True
            self._ws.send_text(_EOF)

    def signal(self, signal: int) -> None:
        """Sends the signal (a number, 1 to 64) to the command's process
        group."""
        self._ws.send_text(json.dumps({"type": "signal", "signal": int(signal)}))

    def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size (only with tty=True). The supervisor
        drops a resize that arrives before the command's terminal exists:
        one asked for before ``started`` is sent when ``started`` is read
        (see ``wait_started``)."""
        message = json.dumps({"type": "resize", "rows": int(rows), "cols": int(cols)})
        with self._resize_lock:
            if not self.started:
                self._pending_resize = message
                return
        self._ws.send_text(message)

    def wait_started(self) -> None:
        """Reads until the command runs (``started``); output that comes
        meanwhile is kept for the iteration. Raises ExecError when it could
        not be run."""
        while not self.started and not self._done:
            out = self._next()
            if out is not None:
                self._early.append(out)
        if not self.started:
            self._finish()

    def _feed(self, source: Any) -> None:
        try:
            if hasattr(source, "read"):
                while True:
                    chunk = source.read(_CHUNK)
                    if not chunk:
                        break
                    self.send(chunk)
            else:
                for chunk in source:
                    if chunk:
                        self.send(chunk)
            self.close_stdin()
        except (ConnectionFailed, OpenShellError):
            pass  # the command ended, or the stream broke: the reader says so

    # Output.

    def __iter__(self) -> Iterator[ExecOutput]:
        while self._early:
            yield self._early.popleft()
        while not self._done:
            out = self._next()
            if out is not None:
                yield out
        self._finish()

    def _next(self) -> Optional[ExecOutput]:
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                self._kill_for_timeout()
                return None
            self._ws.settimeout(left)
        try:
            message = self._ws.recv()
        except socket.timeout:
            self._kill_for_timeout()
            return None
        if message is None:
            self._done = True
            if self.exit_code is None and self._error is None:
                self._error = ConnectionFailed("the exec stream ended before the command did")
            return None
        if isinstance(message, bytes):
            if not message:
                return None
            return ExecOutput(_STREAMS.get(message[0], "stdout"), message[1:])
        try:
            m = json.loads(message)
            kind = m["type"]
        except (ValueError, KeyError, TypeError):
            self._error = ProtocolError("exec stream: a message that is not one: %r" %
                                        message[:200])
            self._done = True
            return None
        if kind == "started":
            with self._resize_lock:
                self.started = True
                pending, self._pending_resize = self._pending_resize, None
            if pending is not None:
                self._ws.send_text(pending)
        elif kind == "exit":
            self.exit_code = int(m.get("code", 0))
            self._end()
        elif kind == "error":
            self._error = ExecError(str(m.get("message", "exec failed")), int(m.get("code", 125)))
            self._end()
        return None

    def _kill_for_timeout(self) -> None:
        # The command is killed; what it wrote until then still comes, and
        # the exit after it (at most 10 s more).
        if not self.timed_out:
            self.timed_out = True
            try:
                self.signal(SIGKILL)
            except ConnectionFailed:
                pass
            self._deadline = time.monotonic() + 10
        else:
            self._error = ConnectionFailed("exec: no exit within 10 s of the kill")
            self._done = True

    def _end(self) -> None:
        # The last message: the server's close follows; answer it.
        self._done = True
        try:
            self._ws.settimeout(1.0)
            while self._ws.recv() is not None:
                pass
        except (socket.timeout, OSError, OpenShellError):
            pass

    def _finish(self) -> None:
        self._ws.abort()
        if self._feeder is not None:
            self._feeder.join(timeout=1.0)
        if self.timed_out:
            raise ExecTimeout("exec: timed out after %s s (killed)" % self._timeout,
                              exit_code=self.exit_code)
        if self._error is not None:
            raise self._error

    def wait(self) -> int:
        """Reads (and drops) the rest of the output; the exit status."""
        for _ in self:
            pass
        assert self.exit_code is not None
        return self.exit_code

    def collect(self, on_output: Optional[Callable[[ExecOutput], None]] = None
                ) -> Tuple[bytes, bytes, int]:
        """(stdout, stderr, exit status) of the rest of the run."""
        out, err = bytearray(), bytearray()
        try:
            for chunk in self:
                if on_output is not None:
                    on_output(chunk)
                (err if chunk.stream == "stderr" else out).extend(chunk.data)
        except ExecTimeout as e:
            e.stdout, e.stderr = bytes(out), bytes(err)
            raise
        assert self.exit_code is not None
        return bytes(out), bytes(err), self.exit_code

    def close(self) -> None:
        """Ends the stream; a command still running is killed."""
        if not self._ws.closed:
            self._ws.close()
        self._done = True
        self._stdin_closed = True

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
