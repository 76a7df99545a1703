"""The client of a gateway's API (docs/api.md)."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from typing import (Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Union,
                    overload)
from urllib.parse import quote

from . import _copy, _paths, _registry
from ._exec import START_HEADER, START_HEADER_MAX, Env, ExecStream, Stdin, start_message
from ._logs import LogFollow, parse_network_line
from ._policy import PolicyAPI
from ._registry import Endpoint, TlsFiles
from ._transport import Http, Transport
from ._websocket import WebSocket
from .errors import NotReady, OpenShellError, WaitTimeout
from .models import FINISHED_PHASES, ExecResult, LogRecord, Sandbox

#: Long requests (create, start, stop, delete, wait) answer within 60 s.
DEFAULT_TIMEOUT = 75.0

Bind = Union[str, Mapping[str, Any]]
Since = Union[int, float, datetime]


def _bind(bind: Bind) -> Dict[str, Any]:
    if isinstance(bind, Mapping):
        return {"source": bind["source"], "target": bind["target"],
                "read_only": bool(bind.get("read_only", False))}
    parts = str(bind).split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError("bind %r: expected SRC:DST or SRC:DST:ro" % bind)
    source = os.path.realpath(parts[0]) if os.path.exists(parts[0]) else parts[0]
    return {"source": source, "target": parts[1], "read_only": len(parts) == 3 and
            parts[2] == "ro"}


def _since_ns(since: Since) -> int:
    if isinstance(since, datetime):
        if since.tzinfo is None:
            since = since.replace(tzinfo=timezone.utc)
        return int(since.timestamp() * 1_000_000_000)
    if isinstance(since, float):
        return int(since * 1_000_000_000)  # seconds since the epoch
    return int(since)


class Client:
    """A connection to one gateway.

    - ``Client()``: the local gateway, on the Unix socket that openshell's
      own commands use (``OPENSHELL_HOME``, root's ``/run/openshell``,
      ``$XDG_RUNTIME_DIR/openshell``, ...; see docs/api.md, "Transport").
    - ``Client(socket_path="/path/gateway.sock")``: that socket.
    - ``Client(gateway="name")``: a gateway registered with ``openshell
      gateway add`` (mutual TLS with its CA, certificate and key).
    - ``Client(endpoint="https://127.0.0.1:17670", tls=TlsFiles(...))``: a
      URL (``unix://``, ``https://``, ``http://``); an https one without
      ``tls`` borrows a registered gateway's files for that URL, else those
      of ``openshell gateway generate-certs`` (STATE_DIR/tls).
    - ``Client.from_environment()``: the gateway openshell's commands would
      choose (``OPENSHELL_GATEWAY``, the active gateway, the local socket).

    Requests share one kept-alive connection (made on first use, remade
    when the gateway closed it); each stream (exec, logs follow) has its own.
    A Client may be used from several threads. It never starts a gateway.
    ``timeout`` bounds each request's connect and answer (seconds)."""

    def __init__(self, socket_path: Optional[str] = None, *, gateway: Optional[str] = None,
                 endpoint: Optional[str] = None, tls: Optional[TlsFiles] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        chosen = [x for x in (socket_path, gateway, endpoint) if x is not None]
        if len(chosen) > 1:
            raise TypeError("Client: give one of socket_path, gateway and endpoint")
        private_run_dir: Optional[str] = None
        if gateway is not None:
            target = _registry.find(gateway)
            self.name = gateway
        elif endpoint is not None:
            target = _registry.parse_endpoint(endpoint)
            self.name = ""
            if target.kind == "tls":
                target = self._with_tls_files(target, tls)
        elif socket_path is not None:
            target = Endpoint("unix", socket_path=socket_path)
            self.name = ""
        else:
            _state, run_dir = _paths.resolve()
            target = Endpoint("unix", socket_path=run_dir + "/gateway.sock")
            private_run_dir = run_dir
            self.name = ""
        self.endpoint = target
        self._transport = Transport(target, timeout, private_run_dir)
        self._http = Http(self._transport)
        self.policy = PolicyAPI(self)

    @staticmethod
    def _with_tls_files(target: Endpoint, tls: Optional[TlsFiles]) -> Endpoint:
        if tls is None:
            url = target.url()
            user, system = _registry.registries()
            for registry in (user, system):
                if not registry:
                    continue
                try:
                    names = sorted(os.listdir(os.path.join(registry, "gateways")))
                except OSError:
                    continue
                for name in names:
                    try:
                        found = _registry.find(name)
                    except OpenShellError:
                        continue
                    if found.url() == url and found.tls is not None:
                        return found
            state, _run = _paths.resolve()
            files = TlsFiles(state + "/tls/ca.crt", state + "/tls/client.crt",
                             state + "/tls/client.key")
            if all(os.path.exists(f) for f in (files.ca, files.cert, files.key)):
                tls = files
        return Endpoint(target.kind, target.socket_path, target.host, target.port, tls)

    @classmethod
    def from_environment(cls, timeout: Optional[float] = DEFAULT_TIMEOUT) -> "Client":
        """The gateway openshell's commands would talk to without -g or
        --gateway-endpoint: OPENSHELL_GATEWAY (a registered name or a URL),
        else the active registered gateway, else the local socket."""
        chosen = os.environ.get("OPENSHELL_GATEWAY", "")
        if chosen:
            if "://" in chosen or chosen.startswith("/"):
                return cls(endpoint=chosen, timeout=timeout)
            return cls(gateway=chosen, timeout=timeout)
        active = _registry.active()
        if active:
            return cls(gateway=active, timeout=timeout)
        return cls(timeout=timeout)

    def close(self) -> None:
        """Closes the kept-alive connection (a later request opens another)."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Client(%s)" % (self.name or self.endpoint.url())

    # The gateway.

    def health(self) -> Dict[str, Any]:
        """``{"status": "ok", "version": ...}``."""
        return self._http.call("GET", "/v1/health")

    def whoami(self) -> Dict[str, Any]:
        """``{"principal", "admin", "transport"}``: who the gateway takes us
        for."""
        return self._http.call("GET", "/v1/whoami")

    def gateway_info(self) -> Dict[str, Any]:
        """``GET /v1/gateway``: its id, pid, socket, state directory,
        listeners and settings."""
        return self._http.call("GET", "/v1/gateway")

    # Sandboxes.

    @staticmethod
    def _sandbox_path(name: str, rest: str = "") -> str:
        if not isinstance(name, str):
            raise TypeError("a sandbox name is a string, not %s" % type(name).__name__)
        return "/v1/sandboxes/" + quote(name, safe="") + rest

    def create(self, name: Optional[str] = None, *, from_: Optional[str] = None,
               command: Optional[Sequence[str]] = None, env: Env = None,
               labels: Optional[Mapping[str, str]] = None, policy: Optional[str] = None,
               policy_source: Optional[str] = None, user: Optional[str] = None,
               binds: Sequence[Bind] = (), cpus: Optional[float] = None,
               memory_bytes: Optional[int] = None, pids: Optional[int] = None,
               tmp_size_bytes: Optional[int] = None, shm_size_bytes: Optional[int] = None,
               no_keep: bool = False, restart: Optional[str] = None,
               ca_certs: Sequence[str] = (), providers: Sequence[str] = (),
               vm: Optional[Mapping[str, Any]] = None, spec: Optional[Mapping[str, Any]] = None,
               wait: bool = True) -> Sandbox:
        """Creates a sandbox and launches it (``POST /v1/sandboxes``).

        ``from_`` is its root: ``"host"`` (the API's default: the host's /
        read-only), a directory (made absolute here), or an image in the
        gateway's store (the gateway never pulls: ``openshell image pull``
        first). ``command`` is its main process (none: it idles until
        stopped). ``spec`` holds any other spec field, as the API names it.
        With ``wait`` (the default) it answers once the sandbox has left
        Provisioning (Ready, or already Completed/Error: check ``phase``);
        without, at once. Raises InvalidName, InvalidSpec, NameTaken,
        ImageNotFound, ..."""
        body_spec: Dict[str, Any] = dict(spec or {})
        if from_ is not None:
            body_spec["from"] = (os.path.realpath(from_)
                                 if from_ != "host" and os.path.isdir(from_) else from_)
        if command is not None:
            if isinstance(command, (str, bytes)):
                raise TypeError("command must be a list of strings (['sh', '-c', CMD])")
            body_spec["command"] = [str(c) for c in command]
        if env is not None:
            from ._exec import env_entries

            body_spec["env"] = env_entries(env)
        if labels is not None:
            body_spec["labels"] = dict(labels)
        if policy is not None:
            body_spec["policy"] = policy
            body_spec["policy_source"] = policy_source or "policy"
        for key, value in (("user", user), ("cpus", cpus), ("memory_bytes", memory_bytes),
                           ("pids", pids), ("tmp_size_bytes", tmp_size_bytes),
                           ("shm_size_bytes", shm_size_bytes), ("restart", restart)):
            if value is not None:
                body_spec[key] = value
        if binds:
            body_spec["binds"] = [_bind(b) for b in binds]
        if no_keep:
            body_spec["no_keep"] = True
        if ca_certs:
            body_spec["ca_certs"] = list(ca_certs)
        if vm is not None:
            body_spec["vm"] = dict(vm)
        body: Dict[str, Any] = {"spec": body_spec}
        if name is not None:
            body["name"] = name
        if providers:
            body["providers"] = list(providers)
        target = "/v1/sandboxes?wait=" + ("ready" if wait else "none")
        return Sandbox.from_json(self._http.call("POST", target, body))

    def get(self, name: str) -> Sandbox:
        """One sandbox. Raises NotFound."""
        return Sandbox.from_json(self._http.call("GET", self._sandbox_path(name)))

    def list(self, selector: Union[str, Mapping[str, Optional[str]], None] = None,
             all: bool = False) -> List[Sandbox]:
        """The caller's sandboxes, oldest first; ``all``: everyone's (admins
        only: AdminOnly otherwise). ``selector``: labels that must match,
        ``"team=docs,tier"`` or ``{"team": "docs", "tier": None}`` (None: has
        the label)."""
        query = []
        if selector:
            if isinstance(selector, Mapping):
                selector = ",".join(k if v is None else "%s=%s" % (k, v)
                                    for k, v in selector.items())
            query.append("selector=" + quote(selector, safe=""))
        if all:
            query.append("all=1")
        target = "/v1/sandboxes" + ("?" + "&".join(query) if query else "")
        return [Sandbox.from_json(s) for s in self._http.call("GET", target)["sandboxes"]]

    def start(self, name: str) -> Sandbox:
        """Starts it again (from Stopped, Completed or Error; a new
        generation in the same workspace); answers when it has left
        Starting. Raises WrongPhase, NotFound, Gone."""
        return Sandbox.from_json(self._http.call("POST", self._sandbox_path(name, "/start")))

    def stop(self, name: str) -> Sandbox:
        """Stops it (SIGTERM, SIGKILL after 10 s; the workspace stays);
        answers when it has left Stopping. Raises WrongPhase, NotFound."""
        return Sandbox.from_json(self._http.call("POST", self._sandbox_path(name, "/stop")))

    def delete(self, name: str) -> None:
        """Deletes it with everything it had, once it is gone. Raises
        NotFound, GatewayTimeout (after 60 s; the delete goes on)."""
        self._http.call("DELETE", self._sandbox_path(name))

    def events(self, name: str, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """What happened to it, oldest first: ``{"time", "type", "message"}``."""
        target = self._sandbox_path(name, "/events")
        if limit is not None:
            target += "?limit=%d" % int(limit)
        return list(self._http.call("GET", target).get("events", []))

    def wait_ready(self, name: str, timeout: float = 60.0) -> Sandbox:
        """Waits until the sandbox is Ready and returns it. Raises NotReady
        when it reaches a phase it does not leave for Ready by itself
        (Completed, Error, Stopped, Deleting), WaitTimeout after
        ``timeout`` seconds, NotFound."""
        deadline = time.monotonic() + timeout
        pause = 0.005
        while True:
            sandbox = self.get(name)
            if sandbox.phase == "Ready":
                return sandbox
            if sandbox.phase in FINISHED_PHASES or sandbox.phase == "Deleting":
                why = sandbox.reason + (": " + sandbox.message if sandbox.message else "")
                raise NotReady("sandbox '%s' is %s%s, not Ready" %
                               (name, sandbox.phase, " (" + why + ")" if why else ""), sandbox)
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout("sandbox '%s' is still %s after %s s" %
                                  (name, sandbox.phase, timeout), sandbox)
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.1)

    def wait(self, name: str, timeout: Optional[float] = None) -> Sandbox:
        """Waits until it has finished (Completed, Error or Stopped) and
        returns it. Raises WaitTimeout after ``timeout`` seconds (None:
        no limit), NotFound, Gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.01
        while True:
            if deadline is None:
                sandbox = Sandbox.from_json(
                    self._http.call("GET", self._sandbox_path(name, "/wait")))
            else:
                sandbox = self.get(name)
            if sandbox.phase in FINISHED_PHASES:
                return sandbox
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout("sandbox '%s' is still %s after %s s" %
                                      (name, sandbox.phase, timeout), sandbox)
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.2)

    # Exec.

    def _open_exec(self, name: str, argv: Sequence[str], *, stdin: Stdin = None, env: Env = None,
                   workdir: Optional[str] = None, user: Optional[str] = None, tty: bool = False,
                   timeout: Optional[float] = None, rows: int = 24, cols: int = 80,
                   copy: bool = False) -> ExecStream:
        start = start_message(argv, env, workdir, user, tty, rows, cols)
        # The start rides in the upgrade request where it fits (the command
        # starts while the answer travels); a supervisor that took it says so.
        early = quote(start, safe="")
        headers = {START_HEADER: early} if len(early) <= START_HEADER_MAX else {}
        ws = WebSocket.connect(self._transport,
                               self._sandbox_path(name, "/exec" + ("?copy=1" if copy else "")),
                               headers=headers)
        ws.settimeout(None)
        if headers and ws.response_headers.get(START_HEADER.lower()) == "accepted":
            start = None
        try:
            return ExecStream(ws, start, stdin, timeout)
        except BaseException:
            ws.abort()
            raise

    def exec(self, name: str, argv: Sequence[str], stdin: Stdin = None, env: Env = None,
             workdir: Optional[str] = None, user: Optional[str] = None, tty: bool = False,
             timeout: Optional[float] = None) -> ExecResult:
        """Runs a command in a Ready sandbox and waits for it: its stdout,
        stderr (bytes) and exit status (128+N for signal N). ``stdin``:
        bytes or text (none: an empty input), a binary file, or an iterable
        of chunks. ``env``: a mapping or ``KEY=VALUE`` entries added to the
        sandbox's environment. ``user``: ``UID[:GID]`` or ``NAME[:GROUP]``.
        ``timeout`` (seconds): the command is killed then, and ExecTimeout
        (with the output so far) is raised. Raises WrongPhase (not Ready),
        NotFound, ExecError (127 not found, 126 not executable, 125
        otherwise)."""
        stream = self._open_exec(name, argv, stdin=b"" if stdin is None else stdin, env=env,
                                 workdir=workdir, user=user, tty=tty, timeout=timeout)
        with stream:
            stdout, stderr, code = stream.collect()
        return ExecResult(stdout, stderr, code)

    def exec_stream(self, name: str, argv: Sequence[str], stdin: Stdin = None, env: Env = None,
                    workdir: Optional[str] = None, user: Optional[str] = None, tty: bool = False,
                    timeout: Optional[float] = None, rows: int = 24,
                    cols: int = 80) -> ExecStream:
        """Starts a command and returns its stream: iterate over it for
        output chunks (``ExecOutput(stream, data)``) as they come; feed it
        with ``send()`` and ``close_stdin()`` (when ``stdin`` is None), or
        give ``stdin`` (bytes, a file, an iterable: sent, then closed).
        ``signal(n)``, ``resize(rows, cols)`` (with ``tty``); ``exit_code``
        once the iteration has ended. Leaving its ``with`` block kills a
        command still running."""
        return self._open_exec(name, argv, stdin=stdin, env=env, workdir=workdir, user=user,
                               tty=tty, timeout=timeout, rows=rows, cols=cols)

    # Files.

    def upload(self, name: str, local: str, dest: str = "/sandbox",
               exclude: Optional[Callable[[str], bool]] = None) -> _copy.UploadStats:
        """Copies ``local`` (a file, a directory with all below it, or a
        symbolic link) into the sandbox's directory ``dest`` under its own
        name, as the sandbox's user, through tar in the sandbox. The sandbox
        may also be Stopped, Completed or Error (the gateway runs a copy of
        its container for it). ``exclude(relative_path)`` True leaves an
        entry out (a directory with all below it). Raises CopyError with
        tar's complaint (a directory it may not write, a full disk)."""
        return _copy.upload(lambda argv: self._open_exec(name, argv, copy=True), local, dest,
                            exclude)

    def download(self, name: str, src: str, local: str) -> str:
        """Copies the sandbox's ``src`` (a file or a directory) to
        ``local``: into it under its own name when ``local`` is a directory,
        else as ``local`` itself (its parent must exist); what it becomes
        must not exist yet. Returns that path. What arrives is unpacked as
        an untrusted archive and moved into place only when complete. Raises
        CopyError."""
        return _copy.download(lambda argv: self._open_exec(name, argv, stdin=b"", copy=True),
                              src, local)

    # Logs.

    def _follow(self, target: str) -> WebSocket:
        ws = WebSocket.connect(self._transport, target)
        ws.settimeout(None)  # a followed log may be quiet for as long as it likes
        return ws

    def _logs_target(self, name: str, source: str, tail: Optional[int],
                     since: Optional[Since], follow: bool) -> str:
        query = []
        if follow:
            query.append("follow=1")
        if source != "sandbox":
            query.append("source=" + quote(source, safe=""))
        if tail is not None:
            query.append("tail=%d" % int(tail))
        if since is not None:
            query.append("since=%d" % _since_ns(since))
        return self._sandbox_path(name, "/logs") + ("?" + "&".join(query) if query else "")

    @overload
    def logs(self, name: str, *, follow: Literal[False] = False, tail: Optional[int] = None,
             since: Optional[Since] = None) -> List[LogRecord]:
        ...

    @overload
    def logs(self, name: str, *, follow: Literal[True], tail: Optional[int] = None,
             since: Optional[Since] = None) -> LogFollow[LogRecord]:
        ...

    def logs(self, name: str, *, follow: bool = False, tail: Optional[int] = None,
             since: Optional[Since] = None) -> Union[List[LogRecord], LogFollow[LogRecord]]:
        """What the main process wrote (CRI records: time, stream, partial,
        text), every generation in turn. ``tail``: the last N records;
        ``since``: from then on (nanoseconds since the epoch, a float of
        seconds, or a datetime). With ``follow``, a LogFollow to iterate:
        the existing records, then new ones as they are written, until the
        sandbox has finished (``.end`` then has its phase and exit code)."""
        target = self._logs_target(name, "sandbox", tail, since, follow)
        if follow:
            return LogFollow(self._follow(target), network=False)
        text = self._http.text("GET", target).decode("utf-8", "replace")
        return [LogRecord.parse(line) for line in text.split("\n") if line]

    @overload
    def network_logs(self, name: str, *, follow: Literal[False] = False,
                     tail: Optional[int] = None,
                     since: Optional[Since] = None) -> List[Dict[str, Any]]:
        ...

    @overload
    def network_logs(self, name: str, *, follow: Literal[True], tail: Optional[int] = None,
                     since: Optional[Since] = None) -> LogFollow[Dict[str, Any]]:
        ...

    def network_logs(self, name: str, *, follow: bool = False, tail: Optional[int] = None,
                     since: Optional[Since] = None
                     ) -> Union[List[Dict[str, Any]], LogFollow[Dict[str, Any]]]:
        """The sandbox's network log: one dict per decision of its egress
        proxy and DNS stub (docs/policy.md, "The audit log"); ``follow``,
        ``tail`` and ``since`` as for ``logs``."""
        target = self._logs_target(name, "network", tail, since, follow)
        if follow:
            return LogFollow(self._follow(target), network=True)
        text = self._http.text("GET", target).decode("utf-8", "replace")
        return [parse_network_line(line) for line in text.split("\n") if line]
