"""What both proxies share: the asyncio loop they run on, faults, and the listener."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

_T = TypeVar("_T")

FaultKind = Literal["cut", "lose_reply", "refuse", "stall"]

# The four faults, as the sweep names them.
CUT: FaultKind = "cut"  # close both sides without forwarding the round trip
LOSE_REPLY: FaultKind = "lose_reply"  # the server executes it; its reply never arrives
REFUSE: FaultKind = "refuse"  # cut it, and refuse every new connection for ``seconds``
STALL: FaultKind = "stall"  # hold it (or its reply) for ``seconds``, then go on


class _Loop:
    """One background event loop for every proxy of the process (daemon thread)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="fault-proxies", daemon=True).start()
                cls._loop = loop
            return cls._loop


def run(coro: Coroutine[Any, Any, _T], timeout: float = 10.0) -> _T:
    """Run ``coro`` on the proxies' loop from a test's thread."""
    return asyncio.run_coroutine_threadsafe(coro, _Loop.get()).result(timeout)


@dataclass(frozen=True)
class RoundTrip:
    """One unit a fault can hit: a Postgres round trip (up to Sync, or one simple query) or a
    batch of Redis commands read together (a pipeline)."""

    text: str  # SQL, or the commands as "NAME arg arg; NAME …"
    phase: str  # "execute", "parse" (a prepare without execution) or "redis"
    application: str = ""  # Postgres: the connection's application_name
    commands: tuple[tuple[bytes, ...], ...] = ()  # Redis: each command's words
    params: str = ""  # Postgres: the executed statements' bound values, as text
    connection: int = 0  # Postgres: which client connection sent it (numbered from 1)


@dataclass
class Fault:
    """Armed on a proxy: hits the ``nth`` matching round trip, once.

    ``stall_reply``: a stall forwards the round trip at once and holds its reply instead.
    ``cut_all``: a refusal also cuts every open connection (a server restart), not only the
    one that carried the matching round trip.
    ``stall_all``: a stall holds all the proxy's traffic, both ways, on every connection
    (new ones included), not only this round trip: the whole server stops answering, as
    when it is paused or a network path blackholes, with no connection closed.
    """

    kind: FaultKind
    matches: Callable[[RoundTrip], bool]
    label: str
    nth: int = 1
    seconds: float = 0.0
    stall_reply: bool = False
    cut_all: bool = False
    stall_all: bool = False
    # Redis, lose_reply only: drop the reply only if it satisfies this (given the batch's
    # replies, raw RESP); otherwise pass it on and stay armed for the next matching batch.
    reply_matches: Callable[[bytes], bool] | None = None
    # Postgres, lose_reply: once the reply is lost, turn new connections away this long (the
    # server went away with it; see ``Proxy.turn_away_for``).
    refuse_after: float = 0.0
    seen: int = 0
    dropped: bytes = b""  # Redis: the replies a lost-reply fault kept from the client
    hit: RoundTrip | None = None
    hit_at: float | None = None
    fired: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float) -> bool:
        return self.fired.wait(timeout)

    def describe(self) -> str:
        extra = f" {self.seconds:g}s" if self.kind in (REFUSE, STALL) else ""
        return f"{self.kind}{extra} on #{self.nth} {self.label}"


class Proxy:
    """A TCP listener on a free local port forwarding to ``upstream``; subclasses speak the
    protocol in ``_relay``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = "127.0.0.1"
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._writers: set[asyncio.StreamWriter] = set()
        self._refusing_until = 0.0
        self._resets = 0  # connections still to turn away (``reset_next``)
        self.reset = 0  # connections turned away by ``reset_next``
        self._frozen_until = 0.0  # a ``stall_all`` fault holds all traffic until then
        self.connections = 0
        self.refused = 0
        # Every round trip seen (text, phase, application), for tests choosing patterns.
        self.seen: list[RoundTrip] = []
        self.keep_seen = False
        self.fired: list[Fault] = []
        self._tasks: set[asyncio.Future[None]] = set()  # refusals under way (kept referenced)

    # --- control, from a test's thread ------------------------------------------------
    def start(self) -> Proxy:
        run(self._listen())
        return self

    def stop(self) -> None:
        self._frozen_until = 0.0  # let held relays see their connections closed
        run(self._close_all(listening=True))

    def arm(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def disarm(self) -> None:
        with self._lock:
            self._faults.clear()

    def refuse_for(self, seconds: float) -> None:
        """Stop listening for ``seconds``: new connections are refused (ECONNREFUSED)."""
        asyncio.run_coroutine_threadsafe(self._refuse(seconds), _Loop.get())

    def cut_all(self) -> None:
        run(self._close_all(listening=False))

    def turn_away_for(self, seconds: float) -> None:
        """Keep listening, but reset every new connection as it arrives for ``seconds``
        (counted in ``refused``; ``open`` ends it early): a server that is there and will not
        serve, where ``refuse_for`` is one whose port is closed."""
        self._refusing_until = max(self._refusing_until, time.monotonic() + seconds)

    def shut_for(self, seconds: float, *, cut: bool = False) -> None:
        """A server restart: from the moment this returns, refuse every new connection for
        ``seconds``; with ``cut``, also close every open one. ``open`` ends it early."""
        self._refusing_until = max(self._refusing_until, time.monotonic() + seconds)
        self.refuse_for(seconds)
        if cut:
            self.cut_all()

    def open(self) -> None:
        """End a refusal now: listen again (within a tenth of a second)."""
        self._refusing_until = 0.0

    def reset_next(self, n: int = 1, *, cut: bool = True) -> None:
        """Turn the next ``n`` connections away (RST) as they arrive, as a server at
        ``max_connections`` does: one failed connect, then service again. With ``cut``, close
        every open connection first, so the client's next statement needs a new one."""
        with self._lock:
            self._resets = n
        if cut:
            self.cut_all()

    def freeze(self, seconds: float = 3600.0) -> None:
        """From now on forward no byte, either way, on any connection, for ``seconds``
        (``stop`` ends it): the server behind stops answering and nothing more reaches it,
        yet no connection closes, as when a network path blackholes."""
        self._frozen_until = max(self._frozen_until, time.monotonic() + seconds)

    # --- on the loop ------------------------------------------------------------------
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _refuse(self, seconds: float) -> None:
        self._refusing_until = max(self._refusing_until, time.monotonic() + seconds)
        if self._server is not None:
            self._server.close()  # not wait_closed(): that would wait for open connections
            self._server = None
            while (left := self._refusing_until - time.monotonic()) > 0:
                await asyncio.sleep(min(left, 0.1))  # short steps: ``open`` may end it early
            for _ in range(50):  # the port may linger briefly; keep the same one
                try:
                    await self._listen()
                    return
                except OSError:
                    await asyncio.sleep(0.1)
            raise RuntimeError(f"fault proxy could not listen on port {self.port} again")

    async def _close_all(self, *, listening: bool) -> None:
        if listening and self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            abort(w)

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        with self._lock:
            turn_away = self._resets > 0
            if turn_away:
                self._resets -= 1
                self.reset += 1
        if turn_away:
            abort(cwriter)
            return
        if time.monotonic() < self._refusing_until:
            self.refused += 1
            abort(cwriter)
            return
        try:
            sreader, swriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            abort(cwriter)
            return
        self.connections += 1
        self._writers.update((cwriter, swriter))
        try:
            await self._relay(creader, cwriter, sreader, swriter)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, Cut):
            pass
        finally:
            abort(cwriter)
            abort(swriter)
            self._writers.discard(cwriter)
            self._writers.discard(swriter)

    async def _relay(
        self,
        creader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        sreader: asyncio.StreamReader,
        swriter: asyncio.StreamWriter,
    ) -> None:
        raise NotImplementedError

    def decide(self, rt: RoundTrip) -> Fault | None:
        """The fault this round trip fires, if any (each fault fires once)."""
        with self._lock:
            if self.keep_seen:
                self.seen.append(rt)
            for fault in self._faults:
                if not fault.matches(rt):  # once per round trip: a matcher may keep state
                    continue
                if fault.reply_matches is not None:
                    return fault  # fires, or not, when its reply is read (``fire``)
                fault.seen += 1
                if fault.seen == fault.nth:
                    self._faults.remove(fault)
                    fault.hit = rt
                    fault.hit_at = time.monotonic()
                    self.fired.append(fault)
                    return fault
        return None

    def fire(self, fault: Fault, rt: RoundTrip) -> bool:
        """Fire a fault that waited for its reply, once: False if it fired already."""
        with self._lock:
            if fault not in self._faults:
                return False
            self._faults.remove(fault)
            fault.seen += 1
            fault.hit = rt
            fault.hit_at = time.monotonic()
            self.fired.append(fault)
        return True

    async def apply_before(self, fault: Fault) -> None:
        """Faults that act before the round trip is forwarded (raise Cut to drop it)."""
        if fault.kind == CUT:
            fault.fired.set()
            raise Cut
        if fault.kind == REFUSE:
            task = asyncio.ensure_future(self._refuse(fault.seconds))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if fault.cut_all:
                await self._close_all(listening=False)
            fault.fired.set()
            raise Cut
        if fault.kind == STALL and fault.stall_all:
            self._frozen_until = max(self._frozen_until, time.monotonic() + fault.seconds)
            fault.fired.set()
            await self.hold()
            return
        if fault.kind == STALL and not fault.stall_reply:
            fault.fired.set()
            await asyncio.sleep(fault.seconds)

    async def hold(self) -> None:
        """Wait while a ``stall_all`` fault holds the traffic (called before forwarding
        anything, either way)."""
        while (left := self._frozen_until - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.1))  # short steps: ``stop`` may end it early


class Cut(Exception):
    """Ends a relay: both sides are closed."""


def abort(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # RST, not FIN: the peer learns at once that the connection is gone.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
