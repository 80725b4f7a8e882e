"""A TCP proxy in front of a Redis server that passes every command through and, when armed,
breaks one round trip of a chosen Lua script (by its SHA1) for real:

- ``drop_reply``: the next ``EVALSHA <sha>`` whose reply is a non-empty array runs on the
  server, and the client's connection is cut before that reply reaches it (a lost reply: the
  script's writes happened, the client cannot know);
- ``refuse``: the next ``EVALSHA <sha>`` with more than ``min_args`` arguments never reaches
  the server; the client's connection is cut instead.

Clients speak RESP2/3 requests (arrays of bulk strings), as redis-py does. The reply is
matched to the command by order: redis-py waits for each reply of a connection before it
sends the next command, outside pipelines (a script call is never pipelined here).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


def _parse_command(buf: bytes) -> tuple[list[bytes], int] | None:
    """One complete RESP request at the start of ``buf``: (arguments, bytes used)."""
    if not buf.startswith(b"*"):
        end = buf.find(b"\r\n")  # an inline command
        return None if end < 0 else (buf[:end].split(), end + 2)
    end = buf.find(b"\r\n")
    if end < 0:
        return None
    count, pos, args = int(buf[1:end]), end + 2, []
    for _ in range(count):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        size = int(buf[pos + 1 : end])
        start = end + 2
        if len(buf) < start + size + 2:
            return None
        args.append(buf[start : start + size])
        pos = start + size + 2
    return args, pos


@dataclass
class _Arm:
    sha: bytes
    mode: str  # "drop_reply" | "refuse"
    min_args: int = 0


@dataclass
class ReplyProxy:
    upstream_port: int
    host: str = "127.0.0.1"
    fired: list[str] = field(default_factory=list)
    _arm: _Arm | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: socket.socket | None = None
    _sockets: list[socket.socket] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"redis://{self.host}:{self._server.getsockname()[1]}/0"

    def start(self) -> ReplyProxy:
        self._server = socket.create_server((self.host, 0))
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        for s in [self._server, *self._sockets]:
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()

    def drop_reply(self, sha: str) -> None:
        with self._lock:
            self._arm = _Arm(sha.encode(), "drop_reply")

    def refuse(self, sha: str, *, min_args: int) -> None:
        with self._lock:
            self._arm = _Arm(sha.encode(), "refuse", min_args)

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection((self.host, self.upstream_port))
            self._sockets += [client, upstream]
            _Pair(self, client, upstream).start()

    def _match(self, args: list[bytes]) -> _Arm | None:
        with self._lock:
            arm = self._arm
            if (
                arm is None
                or len(args) < 2
                or args[0].upper() != b"EVALSHA"
                or args[1].lower() != arm.sha
            ):
                return None
            if arm.mode == "refuse":
                if len(args) <= arm.min_args:
                    return None
                self._arm = None
                self.fired.append("refuse")
            return arm

    def _dropped(self) -> bool:
        """A reply of the armed script was not empty: drop it (once)."""
        with self._lock:
            if self._arm is None or self._arm.mode != "drop_reply":
                return False
            self._arm = None
            self.fired.append("drop_reply")
            return True


class _Pair:
    def __init__(self, proxy: ReplyProxy, client: socket.socket, upstream: socket.socket):
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.watching = threading.Event()  # the next reply answers an armed script call

    def start(self) -> None:
        threading.Thread(target=self._requests, daemon=True).start()
        threading.Thread(target=self._replies, daemon=True).start()

    def close(self) -> None:
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _requests(self) -> None:
        buf = b""
        try:
            while chunk := self.client.recv(65536):
                buf += chunk
                while (parsed := _parse_command(buf)) is not None:
                    args, used = parsed
                    raw, buf = buf[:used], buf[used:]
                    arm = self.proxy._match(args)
                    if arm is not None and arm.mode == "refuse":
                        self.close()  # never sent: the server did nothing
                        return
                    if arm is not None:
                        self.watching.set()
                    self.upstream.sendall(raw)
        except OSError:
            pass
        self.close()

    def _replies(self) -> None:
        held = b""
        try:
            while chunk := self.upstream.recv(65536):
                if not self.watching.is_set():
                    self.client.sendall(chunk)
                    continue
                held += chunk
                if b"\r\n" not in held:
                    continue
                # An empty array or an error (NOSCRIPT before the script is loaded): the
                # script took nothing; pass it on and stay armed.
                took = held.startswith(b"*") and not held.startswith(b"*0\r\n")
                if not took or not self.proxy._dropped():
                    self.watching.clear()
                    self.client.sendall(held)
                    held = b""
                    continue
                self.close()  # the script ran; its reply never arrives
                return
        except OSError:
            pass
        self.close()
