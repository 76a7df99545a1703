"""The exceptions of the SDK.

Every error the gateway's API returns has a body
``{"error": {"code": "...", "message": "..."}}`` (docs/api.md, "Errors");
it becomes an instance of the class registered for its code, else of the
class for its HTTP status, else of :class:`OpenShellError`. Errors that
happen on this side (no gateway listening, a broken stream, an exec that
could not run its command) have classes of their own, all subclasses of
:class:`OpenShellError`, so that one ``except OpenShellError`` catches
everything this package raises on purpose.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class OpenShellError(Exception):
    """Base class. ``code`` is the API's error code (``"not_found"``) or,
    for an error of this side, one of the SDK's own (``"connection"``,
    ``"protocol"``, ``"exec"``, ``"timeout"``, ``"copy"``); ``status`` the
    HTTP status (0 when no response was involved); ``message`` the one line
    for people."""

    code: str = "error"
    status: int = 0

    def __init__(self, message: str, *, code: Optional[str] = None,
                 status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return "%s(%r, code=%r, status=%r)" % (type(self).__name__, self.message, self.code,
                                               self.status)


# By HTTP status.


class BadRequest(OpenShellError):
    """400: the request was not valid (``bad_request`` and the more specific
    codes below)."""

    code = "bad_request"
    status = 400


class Forbidden(OpenShellError):
    """403: the caller may not do this."""

    code = "forbidden"
    status = 403


class NotFound(OpenShellError):
    """404: no such sandbox, revision, provider, path or image."""

    code = "not_found"
    status = 404


class RequestTimeout(OpenShellError):
    """408: the request's head or body did not arrive in time."""

    code = "request_timeout"
    status = 408


class Conflict(OpenShellError):
    """409: the request conflicts with the sandbox's state."""

    code = "conflict"
    status = 409


class Gone(OpenShellError):
    """410: the sandbox was deleted while the request waited."""

    code = "gone"
    status = 410


class InternalError(OpenShellError):
    """500: the gateway failed (a store or file error)."""

    code = "internal"
    status = 500


class Unavailable(OpenShellError):
    """503: the gateway or the sandbox's supervisor cannot serve now."""

    code = "unavailable"
    status = 503


class GatewayTimeout(OpenShellError):
    """504: the operation did not finish in time (it goes on)."""

    code = "timeout"
    status = 504


# By code.


class InvalidName(BadRequest):
    """``invalid_name``: not a DNS label."""

    code = "invalid_name"


class InvalidSpec(BadRequest):
    """``invalid_spec``: the sandbox's spec is not valid (the message names
    the field)."""

    code = "invalid_spec"


class InvalidPolicy(BadRequest):
    """``invalid_policy``: the policy text is not valid
    (``SOURCE:LINE: FIELD: MESSAGE``)."""

    code = "invalid_policy"


class VmUnavailable(BadRequest):
    """``vm_unavailable``: this gateway cannot run micro-VMs."""

    code = "vm_unavailable"


class TlsRequired(BadRequest):
    """``tls_required``: plain HTTP was sent to a TLS port."""

    code = "tls_required"


class NotOwner(Forbidden):
    """``not_owner``: the sandbox is another principal's."""

    code = "not_owner"


class AdminOnly(Forbidden):
    """``admin_only``: an admins' route or view."""

    code = "admin_only"


class PeerInSandbox(Forbidden):
    """``peer_in_sandbox``: the caller runs inside a sandbox."""

    code = "peer_in_sandbox"


class HostPathDenied(Forbidden):
    """``host_path_denied`` and ``host_path_not_allowed``: a host path the
    caller may not use."""

    code = "host_path_denied"


class ImageNotFound(NotFound):
    """``image_not_found``: the image store lacks the image (the gateway
    never pulls: ``openshell image pull`` it first)."""

    code = "image_not_found"


class NameTaken(Conflict):
    """``name_taken``: a sandbox of that name exists."""

    code = "name_taken"


class WrongPhase(Conflict):
    """``wrong_phase``: not allowed in the sandbox's phase (the message names
    it)."""

    code = "wrong_phase"


class StaticChange(Conflict):
    """``static_change``: a policy revision would change a part fixed at
    start on a running sandbox; pass ``at_next_start=True``."""

    code = "static_change"


class Busy(Conflict):
    """``busy``: a copy into or out of the sandbox is in progress, or it is
    starting or stopping."""

    code = "busy"


class TooManyConnections(Unavailable):
    """``too_many_connections``: the caller holds too many connections."""

    code = "too_many_connections"


# This side's.


class ConnectionFailed(OpenShellError):
    """The gateway could not be reached, or is not the one it should be (a
    socket of another user, a TLS certificate that does not verify)."""

    code = "connection"


class ProtocolError(OpenShellError):
    """The gateway answered something this package does not understand (not
    JSON, a broken WebSocket frame)."""

    code = "protocol"


class ExecError(OpenShellError):
    """The exec stream ended in ``error``: the command could not be run.
    ``exit_code`` is 127 (not found), 126 (not executable) or 125 (anything
    else: a missing workdir, a user the policy refuses, the sandbox no longer
    running)."""

    code = "exec"

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CommandFailed(OpenShellError):
    """``ExecResult.check()``: the command ran and exited with a status other
    than 0; ``exit_code``, ``stdout`` and ``stderr`` are its."""

    code = "exit_status"

    def __init__(self, message: str, exit_code: int, stdout: bytes = b"",
                 stderr: bytes = b"") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


class ExecTimeout(OpenShellError):
    """``exec(..., timeout=S)`` ran out: the command was killed (SIGKILL).
    ``stdout`` and ``stderr`` hold what it wrote before."""

    code = "timeout"

    def __init__(self, message: str, stdout: bytes = b"", stderr: bytes = b"",
                 exit_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr
        self.exit_code = exit_code


class WaitTimeout(OpenShellError):
    """A wait (``wait_ready``, ``wait``) ran out; ``sandbox`` is its state
    then."""

    code = "timeout"

    def __init__(self, message: str, sandbox: Any = None) -> None:
        super().__init__(message)
        self.sandbox = sandbox


class NotReady(OpenShellError):
    """``wait_ready``: the sandbox reached a phase from which it does not
    become Ready by itself (Error, Completed, Stopped, Deleting);
    ``sandbox`` is its state."""

    code = "not_ready"

    def __init__(self, message: str, sandbox: Any = None) -> None:
        super().__init__(message)
        self.sandbox = sandbox


class CopyError(OpenShellError):
    """``upload`` or ``download`` could not be done (a local file that
    cannot be read, a destination that exists, tar in the sandbox refusing,
    an archive that breaks the rules); nothing was changed locally."""

    code = "copy"


_BY_CODE: Dict[str, Type[OpenShellError]] = {
    cls.code: cls
    for cls in (BadRequest, InvalidName, InvalidSpec, InvalidPolicy, VmUnavailable, TlsRequired,
                NotOwner, AdminOnly, PeerInSandbox, HostPathDenied, NotFound, ImageNotFound,
                RequestTimeout, NameTaken, WrongPhase, StaticChange, Busy, Gone, InternalError,
                Unavailable, TooManyConnections)
}
_BY_CODE["host_path_not_allowed"] = HostPathDenied

_BY_STATUS: Dict[int, Type[OpenShellError]] = {
    400: BadRequest,
    403: Forbidden,
    404: NotFound,
    408: RequestTimeout,
    409: Conflict,
    410: Gone,
    500: InternalError,
    503: Unavailable,
    504: GatewayTimeout,
}


def from_response(status: int, body: bytes) -> OpenShellError:
    """The exception for a non-2xx answer of the API."""
    import json

    code, message = "", ""
    try:
        parsed = json.loads(body.decode("utf-8", "replace"))
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict):
            code = str(error.get("code", ""))
            message = str(error.get("message", ""))
    except ValueError:
        pass
    if not message:
        message = "the gateway answered %d" % status
    cls = _BY_CODE.get(code)
    if cls is None or (cls.status and cls.status != status):
        cls = _BY_STATUS.get(status, OpenShellError)
    return cls(message, code=code or cls.code, status=status)
