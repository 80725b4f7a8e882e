"""A small TCP proxy in front of PostgreSQL that loses the reply to a COMMIT.

It forwards both directions byte for byte, parsing just enough of the wire protocol to see
message boundaries. When a client sends ``COMMIT`` (a simple 'Q' query, or a 'P' Parse of
it) while a loss is armed, the COMMIT goes to the server, which commits; the proxy reads the
server's reply up to its ReadyForQuery ('Z'), so the commit has happened, forwards none of
it, and closes both sides. The client sees its connection drop during COMMIT: the ambiguous
outcome (it cannot know whether the transaction committed; it did).

``refuse_after_loss`` makes every connection after the loss close at once (a PostgreSQL the
client cannot reach again within its retry budget); ``refuse_all`` does so from now on.

Kept small and self-contained for the submit tests; a general protocol-aware fault proxy can
replace it. Connect through it with ``sslmode=disable&gssencmode=disable``: the proxy does
not speak TLS, and the startup message is then the client's first message.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return bytes(data)


def _is_commit(kind: bytes, payload: bytes) -> bool:
    return _is_command(kind, payload, b"COMMIT")


def _is_command(kind: bytes, payload: bytes, command: bytes) -> bool:
    if kind == b"Q":
        sql = payload.split(b"\x00", 1)[0]
    elif kind == b"P":  # Parse: statement name \0 query \0 ...
        parts = payload.split(b"\x00", 2)
        sql = parts[1] if len(parts) > 1 else b""
    else:
        return False
    return sql.strip().rstrip(b";").strip().upper() == command


@dataclass
class CommitLossProxy:
    upstream_host: str
    upstream_port: int
    refuse_after_loss: bool = False
    refuse_all: bool = False  # every new connection is closed at once
    # Lose only the COMMIT of a transaction that sent a statement containing these bytes
    # (e.g. b"INSERT INTO callgate.turns"), not another one the client commits first.
    only_after: bytes | None = None
    losses_armed: int = 0
    commits_lost: int = 0
    connections: int = 0
    _listener: socket.socket = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def url_for(self, database_url: str) -> str:
        """``database_url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(database_url)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        query = "sslmode=disable&gssencmode=disable"
        query = f"{parts.query}&{query}" if parts.query else query
        return urlunsplit((parts.scheme, f"{userinfo}127.0.0.1:{self.port}", parts.path, query, ""))

    def lose_next_commit(self) -> None:
        with self._lock:
            self.losses_armed += 1

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                refuse = self.refuse_all or (self.refuse_after_loss and self.commits_lost > 0)
            if refuse:
                client.close()
                continue
            try:
                server = socket.create_connection((self.upstream_host, self.upstream_port))
            except OSError:
                client.close()
                continue
            Relay(self, client, server).start()

    def _take_loss(self) -> bool:
        with self._lock:
            if self.losses_armed > 0:
                self.losses_armed -= 1
                return True
            return False


class Relay:
    """One client connection: two pumps, and the loss of one COMMIT's reply."""

    def __init__(self, proxy: CommitLossProxy, client: socket.socket, server: socket.socket):
        self.proxy = proxy
        self.client = client
        self.server = server
        self.losing = threading.Event()  # the server's replies are no longer forwarded
        self.seen = proxy.only_after is None  # the transaction sent the chosen statement

    def start(self) -> None:
        threading.Thread(target=self._client_to_server, daemon=True).start()
        threading.Thread(target=self._server_to_client, daemon=True).start()

    def _close(self) -> None:
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _client_to_server(self) -> None:
        try:
            # The startup message has no type byte.
            (length,) = struct.unpack("!i", _read_exact(self.client, 4))
            self.server.sendall(struct.pack("!i", length) + _read_exact(self.client, length - 4))
            while True:
                kind = _read_exact(self.client, 1)
                (length,) = struct.unpack("!i", _read_exact(self.client, 4))
                payload = _read_exact(self.client, length - 4)
                marker = self.proxy.only_after
                if marker is not None and marker in payload:
                    self.seen = True
                if _is_commit(kind, payload):
                    if self.seen and self.proxy._take_loss():
                        self.losing.set()  # before sending: none of its reply may get through
                    self.seen = marker is None
                elif _is_command(kind, payload, b"ROLLBACK"):
                    self.seen = marker is None
                self.server.sendall(kind + struct.pack("!i", length) + payload)
        except (ConnectionError, OSError):
            self._close()

    def _server_to_client(self) -> None:
        try:
            while True:
                kind = _read_exact(self.server, 1)
                (length,) = struct.unpack("!i", _read_exact(self.server, 4))
                payload = _read_exact(self.server, length - 4)
                if not self.losing.is_set():
                    self.client.sendall(kind + struct.pack("!i", length) + payload)
                elif kind == b"Z":
                    # The server has answered the COMMIT in full: it committed. The client
                    # never hears it.
                    with self.proxy._lock:
                        self.proxy.commits_lost += 1
                    self._close()
                    return
        except (ConnectionError, OSError):
            self._close()
