"""A small RFC 6455 (version 13) client over any connected socket: the
upgrade, masked frames out, fragmented messages in, ping and pong, and the
close handshake. The gateway's streams (exec, log follow, watch) use it."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import threading
from typing import Dict, Optional, Tuple, Union

from ._transport import Transport
from .errors import ConnectionFailed, ProtocolError, from_response

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

# A message longer than this is refused (the gateway's are far smaller).
MAX_MESSAGE = 64 << 20
# The largest head of an HTTP answer to the upgrade.
MAX_HEAD = 64 << 10

Message = Union[str, bytes]


def mask(key: bytes, data: bytes) -> bytes:
    """data XOR the 4-byte key repeated (done on whole integers: C speed)."""
    n = len(data)
    if n == 0:
        return b""
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(keys, "little")).to_bytes(n, "little")


def encode_frame(opcode: int, payload: bytes, fin: bool = True,
                 key: Optional[bytes] = None) -> bytes:
    """One client frame (masked, as a client's must be)."""
    key = os.urandom(4) if key is None else key
    first = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", first, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", first, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, n)
    return head + key + mask(key, payload)


class WebSocket:
    """One upgraded connection. ``recv`` is for one reader at a time;
    ``send_*`` may be called from any thread."""

    def __init__(self, sock: socket.socket, leftover: bytes = b"") -> None:
        self._sock = sock
        self._buf = bytearray(leftover)
        # The upgrade answer's header fields, names in lower case.
        self.response_headers: Dict[str, str] = {}
        self._send_lock = threading.Lock()
        self._close_sent = False
        self.closed = False  # the server's close arrived, or the connection ended
        self.close_code: Optional[int] = None
        self.close_reason = ""
        # A fragmented message being reassembled.
        self._partial_op: Optional[int] = None
        self._partial = bytearray()

    @classmethod
    def connect(cls, transport: Transport, target: str, timeout: Optional[float] = None,
                headers: Optional[Dict[str, str]] = None) -> "WebSocket":
        """GET target with an upgrade (and these header fields). An error
        answer raises the API's exception (a 404, a 409 wrong_phase, ...)."""
        sock = transport.connect(timeout)
        try:
            return cls._handshake(sock, target, headers or {})
        except BaseException:
            sock.close()
            raise

    @classmethod
    def _handshake(cls, sock: socket.socket, target: str,
                   extra: Dict[str, str]) -> "WebSocket":
        key = base64.b64encode(os.urandom(16))
        fields = b"".join(name.encode("ascii") + b": " + value.encode("ascii") + b"\r\n"
                          for name, value in extra.items())
        request = (b"GET " + target.encode("utf-8") + b" HTTP/1.1\r\nHost: localhost\r\n"
                   b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + key +
                   b"\r\nSec-WebSocket-Version: 13\r\n" + fields + b"\r\n")
        try:
            sock.sendall(request)
            data = bytearray()
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionFailed("GET %s: the gateway closed the connection before it "
                                           "answered" % target)
                data += chunk
                if len(data) > MAX_HEAD and b"\r\n\r\n" not in data:
                    raise ProtocolError("GET %s: the answer's head is over %d bytes" %
                                        (target, MAX_HEAD))
        except socket.timeout:
            raise ConnectionFailed("GET %s: no answer in time" % target) from None
        except OSError as e:
            raise ConnectionFailed("GET %s: %s" % (target, e.strerror or e)) from None
        end = data.index(b"\r\n\r\n")
        head, rest = bytes(data[:end]).decode("latin-1"), bytes(data[end + 4:])
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ProtocolError("GET %s: not an HTTP answer: %r" % (target, lines[0][:80]))
        status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status != 101:
            length = int(headers.get("content-length", "0") or 0)
            body = bytearray(rest)
            try:
                while len(body) < length:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    body += chunk
            except OSError:
                pass
            raise from_response(status, bytes(body[:length]))
        expected = base64.b64encode(hashlib.sha1(key + _GUID).digest()).decode("ascii")
        if headers.get("sec-websocket-accept") != expected:
            raise ProtocolError("GET %s: the upgrade's Sec-WebSocket-Accept is wrong" % target)
        if headers.get("upgrade", "").lower() != "websocket":
            raise ProtocolError("GET %s: the answer does not upgrade to websocket" % target)
        ws = cls(sock, rest)
        ws.response_headers = headers
        return ws

    # Sending.

    def _send(self, frames: bytes) -> None:
        with self._send_lock:
            try:
                self._sock.sendall(frames)
            except OSError as e:
                raise ConnectionFailed("the stream broke while sending: %s" %
                                       (e.strerror or e)) from None

    def send_text(self, text: str) -> None:
        self._send(encode_frame(OP_TEXT, text.encode("utf-8")))

    def send_binary(self, data: bytes) -> None:
        self._send(encode_frame(OP_BINARY, bytes(data)))

    def send_messages(self, messages: "list[Message]") -> None:
        """Several messages in one write (one system call)."""
        frames = b"".join(
            encode_frame(OP_TEXT, m.encode("utf-8")) if isinstance(m, str) else encode_frame(
                OP_BINARY, bytes(m)) for m in messages)
        self._send(frames)

    def send_fragmented(self, data: bytes, opcode: int = OP_BINARY,
                        fragment: int = 65536) -> None:
        """One message in several frames (for a peer that wants it so)."""
        pieces = [data[i:i + fragment] for i in range(0, len(data), fragment)] or [b""]
        frames = []
        for i, piece in enumerate(pieces):
            frames.append(encode_frame(opcode if i == 0 else OP_CONTINUATION, piece,
                                       fin=i == len(pieces) - 1))
        self._send(b"".join(frames))

    def ping(self, payload: bytes = b"") -> None:
        self._send(encode_frame(OP_PING, payload))

    # Receiving.

    def settimeout(self, timeout: Optional[float]) -> None:
        self._sock.settimeout(timeout)

    def _fill(self, n: int) -> bool:
        """At least n bytes in the buffer; False at the connection's end. A
        timeout leaves what was read in the buffer, for the next call."""
        while len(self._buf) < n:
            try:
                chunk = self._sock.recv(max(65536, n - len(self._buf)))
            except socket.timeout:
                raise
            except OSError as e:
                if isinstance(e, (ConnectionResetError, BrokenPipeError)):
                    return False
                raise ConnectionFailed("the stream broke: %s" % (e.strerror or e)) from None
            if not chunk:
                return False
            self._buf += chunk
        return True

    def _frame(self) -> Optional[Tuple[bool, int, bytes]]:
        """(fin, opcode, payload) of the next frame; None at the end."""
        if not self._fill(2):
            return None
        b0, b1 = self._buf[0], self._buf[1]
        if b0 & 0x70:
            raise ProtocolError("websocket: a frame with reserved bits set")
        if b1 & 0x80:
            raise ProtocolError("websocket: the server sent a masked frame")
        n = b1 & 0x7F
        at = 2
        if n == 126:
            if not self._fill(4):
                return None
            n = struct.unpack_from("!H", self._buf, 2)[0]
            at = 4
        elif n == 127:
            if not self._fill(10):
                return None
            n = struct.unpack_from("!Q", self._buf, 2)[0]
            at = 10
        if n > MAX_MESSAGE:
            raise ProtocolError("websocket: a frame of %d bytes (at most %d)" % (n, MAX_MESSAGE))
        if not self._fill(at + n):
            return None
        payload = bytes(self._buf[at:at + n])
        del self._buf[:at + n]
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def recv(self) -> Optional[Message]:
        """The next message (str for text, bytes for binary); None once the
        server has closed (its close answered) or the connection ended.
        Raises socket.timeout when a timeout is set and nothing came."""
        while not self.closed:
            frame = self._frame()
            if frame is None:
                self.closed = True
                break
            fin, opcode, payload = frame
            if opcode >= 0x8:
                if not fin or len(payload) > 125:
                    raise ProtocolError("websocket: a fragmented or long control frame")
                if opcode == OP_PING:
                    try:
                        self._send(encode_frame(OP_PONG, payload))
                    except ConnectionFailed:
                        pass
                elif opcode == OP_CLOSE:
                    self._on_close(payload)
                    break
                elif opcode != OP_PONG:
                    raise ProtocolError("websocket: unknown control opcode %d" % opcode)
                continue
            if opcode == OP_CONTINUATION:
                if self._partial_op is None:
                    raise ProtocolError("websocket: a continuation without a message")
                self._partial += payload
            elif opcode in (OP_TEXT, OP_BINARY):
                if self._partial_op is not None:
                    raise ProtocolError("websocket: a new message inside a fragmented one")
                if fin:
                    return payload.decode("utf-8") if opcode == OP_TEXT else payload
                self._partial_op = opcode
                self._partial = bytearray(payload)
            else:
                raise ProtocolError("websocket: unknown opcode %d" % opcode)
            if len(self._partial) > MAX_MESSAGE:
                raise ProtocolError("websocket: a message over %d bytes" % MAX_MESSAGE)
            if fin:
                op, data = self._partial_op, bytes(self._partial)
                self._partial_op, self._partial = None, bytearray()
                return data.decode("utf-8") if op == OP_TEXT else data
        return None

    def _on_close(self, payload: bytes) -> None:
        self.closed = True
        if len(payload) >= 2:
            self.close_code = struct.unpack("!H", payload[:2])[0]
            self.close_reason = payload[2:].decode("utf-8", "replace")
        if not self._close_sent:
            self._close_sent = True
            try:
                self._send(encode_frame(OP_CLOSE, payload[:2]))
            except ConnectionFailed:
                pass

    def close(self, code: int = 1000, wait: float = 1.0) -> None:
        """The close handshake (our close, then the server's, at most `wait`
        seconds), then the connection's end."""
        try:
            if not self._close_sent and not self.closed:
                self._close_sent = True
                try:
                    self._send(encode_frame(OP_CLOSE, struct.pack("!H", code)))
                except ConnectionFailed:
                    self.closed = True
                if not self.closed:
                    self._sock.settimeout(wait)
                    try:
                        while not self.closed and self._frame_until_close():
                            pass
                    except (socket.timeout, OSError, ProtocolError):
                        pass
        finally:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self.closed = True

    def _frame_until_close(self) -> bool:
        frame = self._frame()
        if frame is None:
            self.closed = True
            return False
        _fin, opcode, payload = frame
        if opcode == OP_CLOSE:
            self.closed = True
            if len(payload) >= 2:
                self.close_code = struct.unpack("!H", payload[:2])[0]
            return False
        return True

    def stop(self, code: int = 1000) -> None:
        """From any thread, also while another is in recv(): our close, then
        the connection shut down, so that the reader sees its end (it then
        calls abort() or close())."""
        if not self._close_sent:
            self._close_sent = True
            try:
                self._send(encode_frame(OP_CLOSE, struct.pack("!H", code)))
            except ConnectionFailed:
                pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def abort(self) -> None:
        """Ends the connection without a handshake."""
        try:
            self._sock.close()
        finally:
            self.closed = True
