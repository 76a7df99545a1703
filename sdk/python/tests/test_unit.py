"""The SDK's parts that need no gateway: the WebSocket client against a
scripted server on a socket pair, path resolution, endpoints, the error
mapping, the policy text it writes, and its build backend."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import sys
import threading
import zipfile
from pathlib import Path

import pytest

import openshell
from openshell import _paths, _policy, _registry, _websocket
from openshell.errors import from_response

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def server_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        return struct.pack("!BB", first, n) + payload
    if n < 65536:
        return struct.pack("!BBH", first, 126, n) + payload
    return struct.pack("!BBQ", first, 127, n) + payload


def read_client_frame(sock: socket.socket, buf: bytearray):
    def need(n):
        while len(buf) < n:
            chunk = sock.recv(65536)
            if not chunk:
                raise EOFError
            buf.extend(chunk)

    need(2)
    b0, b1 = buf[0], buf[1]
    assert b1 & 0x80, "a client frame must be masked"
    n, at = b1 & 0x7F, 2
    if n == 126:
        need(4)
        n, at = struct.unpack_from("!H", buf, 2)[0], 4
    elif n == 127:
        need(10)
        n, at = struct.unpack_from("!Q", buf, 2)[0], 10
    need(at + 4 + n)
    key = bytes(buf[at:at + 4])
    payload = bytes(b ^ key[i % 4] for i, b in enumerate(buf[at + 4:at + 4 + n]))
    del buf[:at + 4 + n]
    return bool(b0 & 0x80), b0 & 0x0F, payload


class FakeTransport:
    """A Transport whose connection is one end of a socket pair."""

    def __init__(self, sock):
        self.sock = sock

    def connect(self, timeout=None):
        return self.sock


def serve(script):
    """A client WebSocket connected to a server thread running script(sock,
    buf) after the handshake; the thread's failures are re-raised."""
    ours, theirs = socket.socketpair()
    errors = []

    def run():
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                data += theirs.recv(4096)
            head = data.decode()
            assert head.startswith("GET /v1/test HTTP/1.1\r\n")
            key = [line.split(": ", 1)[1] for line in head.split("\r\n")
                   if line.lower().startswith("sec-websocket-key")][0]
            accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
            theirs.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                            "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" %
                            accept).encode())
            script(theirs, bytearray())
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors.append(e)
        finally:
            theirs.close()

    thread = threading.Thread(target=run)
    thread.start()
    ws = _websocket.WebSocket.connect(FakeTransport(ours), "/v1/test")
    return ws, thread, errors


def test_websocket_fragments_ping_and_close():
    big = os.urandom(70000)

    def script(sock, buf):
        # A text message in three fragments with a ping among them.
        sock.sendall(server_frame(0x1, b"hel", fin=False) + server_frame(0x9, b"p!") +
                     server_frame(0x0, b"lo ", fin=False) + server_frame(0x0, b"world"))
        assert read_client_frame(sock, buf) == (True, 0xA, b"p!")  # the pong
        sock.sendall(server_frame(0x2, big))
        assert read_client_frame(sock, buf) == (True, 0x2, big)
        assert read_client_frame(sock, buf) == (True, 0x1, "h\u00e9".encode())
        fragments = []
        while True:
            fin, op, payload = read_client_frame(sock, buf)
            fragments.append((op, payload))
            if fin:
                break
        assert [op for op, _ in fragments] == [0x2, 0x0, 0x0]
        assert b"".join(p for _, p in fragments) == b"z" * 150000
        sock.sendall(server_frame(0x8, struct.pack("!H", 1000) + b"bye"))
        assert read_client_frame(sock, buf) == (True, 0x8, struct.pack("!H", 1000))

    ws, thread, errors = serve(script)
    ws.settimeout(10)
    assert ws.recv() == "hello world"
    assert ws.recv() == big
    ws.send_binary(big)
    ws.send_text("h\u00e9")
    ws.send_fragmented(b"z" * 150000, fragment=65536)
    assert ws.recv() is None
    assert (ws.close_code, ws.close_reason) == (1000, "bye")
    ws.close()
    thread.join(5)
    assert not errors, errors


def test_websocket_client_close_handshake():
    def script(sock, buf):
        assert read_client_frame(sock, buf) == (True, 0x8, struct.pack("!H", 1000))
        sock.sendall(server_frame(0x8, struct.pack("!H", 1000)))

    ws, thread, errors = serve(script)
    ws.close()
    thread.join(5)
    assert not errors, errors
    assert ws.closed and ws.close_code == 1000


def test_websocket_refuses_a_masked_server_frame():
    def script(sock, buf):
        sock.sendall(b"\x81\x81abcd\x00")
        sock.recv(100)

    ws, thread, errors = serve(script)
    with pytest.raises(openshell.ProtocolError):
        ws.recv()
    ws.abort()
    thread.join(5)


def test_websocket_error_answer_is_the_api_error():
    ours, theirs = socket.socketpair()
    body = b'{"error":{"code":"wrong_phase","message":"sandbox \'x\' is Stopped"}}\n'

    def run():
        theirs.recv(4096)
        theirs.sendall(b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    thread = threading.Thread(target=run)
    thread.start()
    with pytest.raises(openshell.WrongPhase) as e:
        _websocket.WebSocket.connect(FakeTransport(ours), "/v1/test")
    assert e.value.message == "sandbox 'x' is Stopped"
    thread.join(5)
    theirs.close()


def test_mask():
    key = b"\x01\x02\x03\x04"
    data = os.urandom(1001)
    masked = _websocket.mask(key, data)
    assert masked == bytes(b ^ key[i % 4] for i, b in enumerate(data))
    assert _websocket.mask(key, masked) == data
    assert _websocket.mask(key, b"") == b""


def test_paths():
    r = _paths.resolve
    assert r({"OPENSHELL_HOME": "/x/y/"}, 1000) == ("/x/y", "/x/y/run")
    assert r({}, 0) == ("/var/lib/openshell", "/run/openshell")
    assert r({"HOME": "/home/a", "XDG_RUNTIME_DIR": "/run/user/1000"}, 1000) == (
        "/home/a/.local/state/openshell", "/run/user/1000/openshell")
    assert r({"HOME": "/home/a"}, 1000) == ("/home/a/.local/state/openshell",
                                            "/home/a/.local/state/openshell/run")
    assert r({"XDG_STATE_HOME": "/s"}, 1000)[0] == "/s/openshell"
    long_home = "/home/" + "a" * 60
    assert r({"HOME": long_home}, 1000)[1] == "/tmp/openshell-1000"
    with pytest.raises(openshell.OpenShellError):
        r({"OPENSHELL_HOME": "relative"}, 1000)
    with pytest.raises(openshell.OpenShellError):
        r({}, 1000)


def test_endpoints():
    p = _registry.parse_endpoint
    assert p("unix:///run/x.sock") == _registry.Endpoint("unix", socket_path="/run/x.sock")
    assert p("/run/x.sock").kind == "unix"
    e = p("https://[::1]:17670/")
    assert (e.kind, e.host, e.port, e.url()) == ("tls", "::1", 17670, "https://[::1]:17670")
    assert p("http://127.0.0.1:9").kind == "tcp"
    for bad, why in (("ftp://x:1", "scheme"), ("https://x", "a port is required"),
                     ("https://x:0", "from 1 to 65535"), ("https://x:1/p", "no path"),
                     ("unix://rel", "absolute"), ("x", "expected")):
        with pytest.raises(openshell.OpenShellError) as err:
            p(bad)
        assert why in err.value.message
    with pytest.raises(openshell.OpenShellError):
        _registry.check_gateway_name("-x")
    _registry.check_gateway_name("lab.1_a-b")


def test_registry(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "user"), "OPENSHELL_SYSTEM_CONFIG_DIR":
           str(tmp_path / "system")}
    for registry, name, url in (("user", "a", "https://127.0.0.1:1"),
                                ("system", "a", "https://127.0.0.1:2"),
                                ("system", "b", "unix:///x.sock")):
        d = tmp_path / registry / "openshell" / "gateways" / name if registry == "user" else \
            tmp_path / registry / "gateways" / name
        d.mkdir(parents=True)
        (d / "endpoint.json").write_text('{"endpoint": "%s"}' % url)
        if name == "a":
            (d / "ca.crt").write_text("x")
    a = _registry.find("a", env)
    assert a.url() == "https://127.0.0.1:1"  # the user's shadows the system's
    assert a.tls is not None and a.tls.ca.endswith("/user/openshell/gateways/a/ca.crt")
    assert _registry.find("b", env).socket_path == "/x.sock"
    assert _registry.active(env) == ""
    (tmp_path / "system" / "active").write_text("b\n")
    assert _registry.active(env) == "b"
    (tmp_path / "user" / "openshell" / "active").write_text("a\n")
    assert _registry.active(env) == "a"
    with pytest.raises(openshell.OpenShellError):
        _registry.find("c", env)


def test_error_mapping():
    def err(status, code):
        return from_response(status, b'{"error":{"code":"%s","message":"m"}}' % code.encode())

    assert type(err(404, "not_found")) is openshell.NotFound
    assert type(err(404, "image_not_found")) is openshell.ImageNotFound
    assert type(err(409, "wrong_phase")) is openshell.WrongPhase
    assert type(err(403, "unix_only")) is openshell.Forbidden
    assert type(err(403, "host_path_not_allowed")) is openshell.HostPathDenied
    assert type(err(504, "timeout")) is openshell.GatewayTimeout
    e = err(418, "teapot")
    assert type(e) is openshell.OpenShellError and (e.code, e.status) == ("teapot", 418)
    e = from_response(502, b"<html>")
    assert type(e) is openshell.OpenShellError and e.message == "the gateway answered 502"


def test_policy_rule_text():
    text = _policy.rule_table("sdk", ["a.test:443", ("b.test", 80)], ["/usr/bin/curl"],
                              ["10.0.0.0/8"])
    assert text == ('\n[network_policies.sdk]\nendpoints = [\n'
                    '  { host = "a.test", port = 443, allowed_ips = ["10.0.0.0/8"] },\n'
                    '  { host = "b.test", port = 80, allowed_ips = ["10.0.0.0/8"] },\n]\n'
                    'binaries = [{ path = "/usr/bin/curl" }]\n')
    assert _policy._has_rule("[network_policies.sdk]\n", "sdk")
    assert _policy._has_rule("  [ network_policies.sdk.x ]\n", "sdk")
    assert not _policy._has_rule("[network_policies.sdk-2]\n", "sdk")
    assert "[network_policies.\"a b\"]" in _policy.rule_table("a b", ["x:1"], [], [])


def test_build_backend_wheel(tmp_path):
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "build_backend"))
    try:
        import openshell_build
    finally:
        sys.path.pop(0)
    name = openshell_build.build_wheel(str(tmp_path))
    assert name == "openshell-%s-py3-none-any.whl" % openshell.__version__
    with zipfile.ZipFile(str(tmp_path / name)) as z:
        names = z.namelist()
        record = z.read("openshell-%s.dist-info/RECORD" % openshell.__version__).decode()
    assert "openshell/py.typed" in names and "openshell/client.py" in names
    assert not [n for n in names if "__pycache__" in n]
    assert "openshell/client.py,sha256=" in record
    sdist = openshell_build.build_sdist(str(tmp_path))
    assert sdist == "openshell-%s.tar.gz" % openshell.__version__

