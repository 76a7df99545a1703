"""The gateways this user knows by name, as `openshell gateway add` writes
them (src/cli/gateway_registry.{h,cc}), and gateway endpoints (URLs).

A registry is a directory: gateways/NAME/endpoint.json ({"endpoint": URL})
and, for a TLS gateway, ca.crt, client.crt and client.key beside it; the
file `active` names the active gateway. The user's registry is
$XDG_CONFIG_HOME/openshell (~/.config/openshell); the system's
/etc/openshell ($OPENSHELL_SYSTEM_CONFIG_DIR moves it). A user entry
shadows a system entry of the same name.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from .errors import OpenShellError


@dataclass(frozen=True)
class TlsFiles:
    ca: str
    cert: str
    key: str


@dataclass(frozen=True)
class Endpoint:
    """Where a gateway is: ``kind`` "unix" (``socket_path``), "tls"
    (``host``, ``port`` and ``tls``) or "tcp" (plain, loopback only)."""

    kind: str
    socket_path: str = ""
    host: str = ""
    port: int = 0
    tls: Optional[TlsFiles] = None

    def url(self) -> str:
        if self.kind == "unix":
            return "unix://" + self.socket_path
        host = "[%s]" % self.host if ":" in self.host else self.host
        return "%s://%s:%d" % ("https" if self.kind == "tls" else "http", host, self.port)


def _config_error(message: str) -> OpenShellError:
    return OpenShellError(message, code="config")


def parse_endpoint(text: str) -> Endpoint:
    """unix:///PATH (or the bare path), https://HOST:PORT, http://HOST:PORT
    (IPv6 in brackets), as net::Endpoint::parse reads them."""
    what = "gateway endpoint"
    if not text:
        raise _config_error(what + ": empty")
    if text.startswith("/"):
        return Endpoint("unix", socket_path=text)
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise _config_error("%s '%s': expected unix:///PATH, https://HOST:PORT or "
                            "http://HOST:PORT" % (what, text))
    if scheme == "unix":
        if not rest.startswith("/"):
            raise _config_error("%s '%s': a Unix socket's path is absolute (unix:///PATH)" %
                                (what, text))
        return Endpoint("unix", socket_path=rest)
    if scheme not in ("https", "http"):
        raise _config_error("%s '%s': the scheme must be unix, https or http" % (what, text))
    rest = rest.rstrip("/")
    if "/" in rest:
        raise _config_error("%s '%s': a gateway's URL has no path" % (what, text))
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0 or rest[close + 1:close + 2] != ":":
            raise _config_error("%s '%s': an IPv6 address is written [ADDRESS]:PORT" %
                                (what, text))
        host, port_text = rest[1:close], rest[close + 2:]
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            raise _config_error("%s '%s': a port is required (HOST:PORT)" % (what, text))
        if ":" in host:
            raise _config_error("%s '%s': an IPv6 address is written [ADDRESS]:PORT" %
                                (what, text))
    if not host:
        raise _config_error("%s '%s': a host is required (HOST:PORT)" % (what, text))
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise _config_error("%s '%s': the port must be a number from 1 to 65535" % (what, text))
    return Endpoint("tls" if scheme == "https" else "tcp", host=host, port=int(port_text))


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$")


def check_gateway_name(name: str) -> None:
    if not name:
        raise _config_error("gateway name '': empty")
    if len(name) > 63:
        raise _config_error("gateway name '%s': longer than 63 characters" % name)
    if name[0] in ".-":
        raise _config_error("gateway name '%s': starts with '%s'" % (name, name[0]))
    if not _NAME.match(name):
        raise _config_error("gateway name '%s': only letters, digits, '-', '_' and '.' are "
                            "allowed" % name)


def registries(environ: Optional[Mapping[str, str]] = None) -> Tuple[str, str]:
    """(the user's registry, the system's); the user's is "" when neither
    XDG_CONFIG_HOME nor HOME is set."""
    environ = os.environ if environ is None else environ
    user = environ.get("XDG_CONFIG_HOME", "")
    if not user:
        home = environ.get("HOME", "")
        user = home + "/.config" if home else ""
    if user:
        user += "/openshell"
    system = environ.get("OPENSHELL_SYSTEM_CONFIG_DIR", "") or "/etc/openshell"
    return user, system


def _read_entry(registry: str, name: str) -> Optional[Endpoint]:
    if not registry:
        return None
    directory = os.path.join(registry, "gateways", name)
    meta_file = os.path.join(directory, "endpoint.json")
    try:
        with open(meta_file, "rb") as f:
            text = f.read()
    except OSError:
        return None
    try:
        meta = json.loads(text.decode("utf-8"))
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or not isinstance(meta.get("endpoint"), str):
        raise _config_error('%s: not a gateway\'s entry (expected {"endpoint": URL})' % meta_file)
    try:
        endpoint = parse_endpoint(meta["endpoint"])
    except OpenShellError as e:
        raise _config_error("%s: %s" % (meta_file, e.message)) from None
    if os.path.exists(os.path.join(directory, "ca.crt")):
        endpoint = Endpoint(endpoint.kind, endpoint.socket_path, endpoint.host, endpoint.port,
                            TlsFiles(os.path.join(directory, "ca.crt"),
                                     os.path.join(directory, "client.crt"),
                                     os.path.join(directory, "client.key")))
    return endpoint


def find(name: str, environ: Optional[Mapping[str, str]] = None) -> Endpoint:
    """The registered gateway's endpoint, with its TLS files. Raises
    OpenShellError (code "config") for a bad or unknown name."""
    check_gateway_name(name)
    user, system = registries(environ)
    for registry in (user, system):
        endpoint = _read_entry(registry, name)
        if endpoint is not None:
            return endpoint
    raise _config_error("gateway %s: no such gateway is registered (see 'openshell gateway "
                        "list')" % name)


def active(environ: Optional[Mapping[str, str]] = None) -> str:
    """The user's active gateway's name, else the system's; "" for none."""
    for registry in registries(environ):
        if not registry:
            continue
        try:
            with open(os.path.join(registry, "active"), encoding="utf-8") as f:
                name = f.read().rstrip("\n ")
        except OSError:
            continue
        if not name:
            continue
        try:
            check_gateway_name(name)
        except OpenShellError:
            continue
        if _read_entry(registry, name) is not None or any(
                _read_entry(r, name) is not None for r in registries(environ)):
            return name
    return ""
