"""A TCP door in front of PostgreSQL that a test shuts and opens.

Shut, its listening socket is closed: a new connection is refused by the kernel (the driver
sees ``ECONNREFUSED``, as during a restart); with ``cut``, every session through it is
closed too, as a restart cuts them. Opened again, it listens on the same port.
``reset_next(n)`` resets the next ``n`` connections as they arrive, as a server at
``max_connections`` or going down turns them away: one failed connect, then service again.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from sqlalchemy.engine import make_url


class Door:
    def __init__(self, upstream_url: str) -> None:
        url = make_url(upstream_url)
        self.upstream = (url.host or "127.0.0.1", url.port or 5432)
        self._url = url
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._sessions: set[socket.socket] = set()
        self.accepted = 0
        self._reset = 0
        self.reset = 0  # connections turned away by reset_next
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        self.open()

    @property
    def url(self) -> str:
        """The upstream URL, through the door."""
        return self._url.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def open(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def shut(self, *, cut: bool = False) -> None:
        """Refuse new connections; with ``cut``, also close every open session."""
        with self._lock:
            listener, self._listener = self._listener, None
            sessions = list(self._sessions) if cut else []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            listener.close()
        for s in sessions:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def reset_next(self, n: int = 1, *, cut: bool = True) -> None:
        """Turn the next ``n`` connections away (RST); with ``cut``, also close every open
        session first, so the next statement needs a new connection."""
        with self._lock:
            self._reset = n
            sessions = list(self._sessions) if cut else []
        for s in sessions:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def shut_for(self, seconds: float, *, cut: bool = False) -> threading.Timer:
        """Shut now, open again after ``seconds``."""
        self.shut(cut=cut)
        timer = threading.Timer(seconds, self.open)
        timer.daemon = True
        timer.start()
        return timer

    def close(self) -> None:
        self.shut(cut=True)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # shut
            with self._lock:
                turn_away = self._reset > 0
                if turn_away:
                    self._reset -= 1
                    self.reset += 1
            if turn_away:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # shut while this one was being accepted
                    client.close()
                    server.close()
                    continue
                self.accepted += 1
                self._sessions.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
                with self._lock:
                    self._sessions.discard(s)
