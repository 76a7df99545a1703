"""openshell: the Python client of the openshell gateway's API.

    import openshell

    client = openshell.Client()              # the local gateway's Unix socket
    box = client.create("demo", from_="/srv/rootfs")
    result = client.exec("demo", ["sh", "-c", "echo hi"])
    print(result.stdout, result.exit_code)
    client.delete("demo")

Standard library only. See README.md beside this package, and the API in
docs/api.md of the openshell repository.
"""

from ._copy import UploadStats
from ._exec import ExecStream
from ._logs import LogFollow
from ._policy import PolicyAPI
from ._registry import Endpoint, TlsFiles
from .client import Client
from .errors import (AdminOnly, BadRequest, Busy, CommandFailed, Conflict, ConnectionFailed,
                     CopyError, ExecError, ExecTimeout, Forbidden, GatewayTimeout, Gone,
                     HostPathDenied, ImageNotFound, InternalError, InvalidName, InvalidPolicy,
                     InvalidSpec, NameTaken, NotFound, NotOwner, NotReady, OpenShellError,
                     PeerInSandbox, ProtocolError, RequestTimeout, StaticChange, TlsRequired,
                     TooManyConnections, Unavailable, VmUnavailable, WaitTimeout, WrongPhase)
from .models import (Condition, ExecOutput, ExecResult, LogEnd, LogRecord, PolicyRevision,
                     PolicyUpdate, Sandbox)

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Condition", "ExecResult", "ExecOutput", "ExecStream", "LogRecord",
    "LogEnd", "LogFollow", "PolicyAPI", "PolicyRevision", "PolicyUpdate", "UploadStats",
    "Endpoint", "TlsFiles", "OpenShellError", "BadRequest", "InvalidName", "InvalidSpec",
    "InvalidPolicy", "VmUnavailable", "TlsRequired", "Forbidden", "NotOwner", "AdminOnly",
    "PeerInSandbox", "HostPathDenied", "NotFound", "ImageNotFound", "RequestTimeout", "Conflict",
    "NameTaken", "WrongPhase", "StaticChange", "Busy", "Gone", "InternalError", "Unavailable",
    "TooManyConnections", "GatewayTimeout", "ConnectionFailed", "ProtocolError", "ExecError",
    "ExecTimeout", "CommandFailed", "WaitTimeout", "NotReady", "CopyError", "__version__"
]
