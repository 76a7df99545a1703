"""Connections to a gateway: its Unix socket (with the peer checks the
command line makes), TCP with mutual TLS, or plain TCP on loopback; and
JSON requests over one kept-alive HTTP/1.1 connection."""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
import ssl
import struct
import threading
from typing import Any, Optional, Tuple

from . import _paths
from ._registry import Endpoint
from .errors import ConnectionFailed, OpenShellError, ProtocolError, from_response

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Transport:
    """Makes connected sockets to one gateway. The TLS context (the CA, the
    client certificate and its key) is loaded once, here: a connection only
    connects and shakes hands."""

    def __init__(self, endpoint: Endpoint, timeout: Optional[float],
                 private_run_dir: Optional[str] = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._private_run_dir = private_run_dir
        self._context: Optional[ssl.SSLContext] = None
        if endpoint.kind == "tls":
            self._context = self._tls_context()
        if private_run_dir is not None:
            self.check_private()

    def describe(self) -> str:
        return self.endpoint.url()

    def check_private(self) -> None:
        """The local default's run directory and socket are still ours and
        private (another user could have made them first)."""
        if self._private_run_dir is None:
            return
        problem = (_paths.private_dir_problem(self._private_run_dir) or
                   _paths.private_socket_problem(self.endpoint.socket_path))
        if problem:
            raise ConnectionFailed(problem)

    def _tls_context(self) -> ssl.SSLContext:
        files = self.endpoint.tls
        url = self.endpoint.url()
        if files is None:
            raise ConnectionFailed(
                "%s: no credentials for it (register it with 'openshell gateway add %s --ca FILE "
                "--cert FILE --key FILE')" % (url, url))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_verify_locations(cafile=files.ca)
        except (OSError, ssl.SSLError) as e:
            raise ConnectionFailed("%s: the CA %s: %s" % (url, files.ca, _reason(e))) from None
        try:
            context.load_cert_chain(files.cert, files.key)
        except (OSError, ssl.SSLError) as e:
            raise ConnectionFailed("%s: the client certificate %s (key %s): %s" %
                                   (url, files.cert, files.key, _reason(e))) from None
        return context

    def connect(self, timeout: Optional[float] = None) -> socket.socket:
        """A new connection, ready for HTTP. Raises ConnectionFailed."""
        timeout = self.timeout if timeout is None else timeout
        e = self.endpoint
        if e.kind == "unix":
            return self._connect_unix(timeout)
        try:
            sock = socket.create_connection((e.host, e.port), timeout=timeout)
        except OSError as err:
            if err.errno in (errno.ECONNREFUSED, errno.ENOENT):
                raise ConnectionFailed("nothing listens at %s" % e.url()) from None
            raise ConnectionFailed("connect to %s: %s" % (e.url(), _reason(err))) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._context is None:
            return sock
        try:
            return self._context.wrap_socket(sock, server_hostname=e.host)
        except ssl.SSLCertVerificationError as err:
            sock.close()
            if err.verify_code == 62 or "match" in str(err.verify_message):
                why = ("the gateway's certificate at %s is not issued for %s (its subject "
                       "alternative names do not include it)" % (e.url(), e.host))
            else:
                why = ("the gateway's certificate at %s is not signed by the CA in %s (%s)" %
                       (e.url(), e.tls.ca if e.tls else "", err.verify_message))
            raise ConnectionFailed(why) from None
        except ssl.SSLError as err:
            sock.close()
            raise ConnectionFailed(self.explain_tls(err)) from None
        except OSError as err:
            sock.close()
            raise ConnectionFailed("TLS with %s: %s" % (e.url(), _reason(err))) from None

    def explain_tls(self, err: ssl.SSLError) -> str:
        """One line for a TLS failure. With TLS 1.3 the gateway judges our
        certificate after our side of the handshake: its refusal arrives as
        an alert on the first read, so requests ask here too."""
        e = self.endpoint
        reason = err.reason or ""
        if "WRONG_VERSION_NUMBER" in reason or "record layer" in str(err):
            return ("the server at %s:%d answered in plain HTTP where TLS was expected (an "
                    "--insecure-listen port is reached with http://%s:%d)" %
                    (e.host, e.port, e.host, e.port))
        if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason:
            return ("the gateway at %s refused our certificate: it is not signed by a CA the "
                    "gateway trusts" % e.url())
        if "EXPIRED" in reason:
            return "the gateway at %s refused our certificate: it has expired" % e.url()
        if "CERTIFICATE_REQUIRED" in reason:
            return ("the gateway at %s refused the connection: it requires a client certificate "
                    "and we gave none" % e.url())
        return "TLS with %s: %s" % (e.url(), _reason(err))

    def _connect_unix(self, timeout: Optional[float]) -> socket.socket:
        path = self.endpoint.socket_path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as err:
            sock.close()
            if err.errno in (errno.ENOENT, errno.ECONNREFUSED):
                raise ConnectionFailed(
                    "no gateway listens at %s (start one with 'openshell gateway run', or any "
                    "'openshell sandbox' command)" % path) from None
            raise ConnectionFailed("connect to the gateway at %s: %s" %
                                   (path, _reason(err))) from None
        # The server must be us or root: never talk to another user's.
        _pid, uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        euid = os.geteuid()
        if uid not in (euid, 0):
            sock.close()
            raise ConnectionFailed(
                "the server at %s runs as uid %d, not as you (uid %d) or root: refusing to talk "
                "to it" % (path, uid, euid))
        return sock


def _reason(err: BaseException) -> str:
    if isinstance(err, ssl.SSLError) and err.reason:
        return str(err.reason)
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err)


class _Connection(http.client.HTTPConnection):
    def __init__(self, transport: Transport) -> None:
        super().__init__("localhost", timeout=transport.timeout)
        self._transport = transport

    def connect(self) -> None:
        self.sock = self._transport.connect()


# The failures of a kept-alive connection that the gateway closed while it
# was idle (60 s): the request never reached it, and goes again on a new one.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class Http:
    """JSON requests on one kept-alive connection, one at a time (a lock
    makes a Client usable from several threads; streams have their own
    connections)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self._conn: Optional[_Connection] = None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def request(self, method: str, target: str, body: Any = None) -> Tuple[int, bytes]:
        """(status, body) of any answer. Raises ConnectionFailed."""
        payload = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        with self._lock:
            for attempt in (0, 1):
                reused = self._conn is not None
                if self._conn is None:
                    self._conn = _Connection(self._transport)
                conn = self._conn
                try:
                    conn.request(method, target, body=payload, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                    if response.will_close:
                        conn.close()
                        self._conn = None
                    return response.status, data
                except OpenShellError:
                    self._conn = None
                    raise
                except _STALE as err:
                    conn.close()
                    self._conn = None
                    if reused and attempt == 0:
                        continue
                    raise ConnectionFailed("%s %s at %s: the connection broke: %s" %
                                           (method, target, self._transport.describe(),
                                            _reason(err))) from None
                except socket.timeout:
                    conn.close()
                    self._conn = None
                    raise ConnectionFailed("%s %s at %s: no answer within %s s" %
                                           (method, target, self._transport.describe(),
                                            self._transport.timeout)) from None
                except ssl.SSLError as err:
                    conn.close()
                    self._conn = None
                    raise ConnectionFailed(self._transport.explain_tls(err)) from None
                except (OSError, http.client.HTTPException) as err:
                    conn.close()
                    self._conn = None
                    raise ConnectionFailed("%s %s at %s: %s" %
                                           (method, target, self._transport.describe(),
                                            _reason(err))) from None
        raise AssertionError("unreachable")

    def call(self, method: str, target: str, body: Any = None) -> Any:
        """The JSON of a 2xx answer; an error answer raises its exception."""
        status, data = self.request(method, target, body)
        if not 200 <= status < 300:
            raise from_response(status, data)
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError:
            raise ProtocolError("%s %s: the gateway answered with something that is not JSON" %
                                (method, target)) from None

    def text(self, method: str, target: str) -> bytes:
        """The raw body of a 2xx answer (the logs)."""
        status, data = self.request(method, target)
        if not 200 <= status < 300:
            raise from_response(status, data)
        return data
