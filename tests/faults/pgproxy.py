"""A Postgres proxy that understands the wire protocol well enough to fault one round trip.

Frontend: the startup packet (an SSL or GSS encryption request is answered 'N' here, so the
stream stays readable), then typed messages. Extended-protocol messages (Parse, Bind,
Describe, Execute, Close, Flush) are held until their Sync and travel as one round trip; a
simple Query is a round trip of its own. Prepared statement and portal names are tracked, so
an Execute of a statement prepared long before (psycopg's ``prepare=True``) is matched on
its SQL. Backend: messages are attributed to the oldest round trip still waiting, which ends
at its ReadyForQuery ('Z').
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import re
import struct
from dataclasses import dataclass

from tests.faults.core import (
    CUT,
    LOSE_REPLY,
    REFUSE,
    STALL,
    Cut,
    Fault,
    FaultKind,
    Proxy,
    RoundTrip,
)

SSL_REQUEST = 80877103
GSS_REQUEST = 80877104
CANCEL_REQUEST = 80877102
EXTENDED = frozenset(b"PBDECH")


@dataclass
class _Waiting:
    """A round trip forwarded to the server whose ReadyForQuery has not come back."""

    rt: RoundTrip
    fault: Fault | None = None


def _cstring(body: bytes, at: int) -> tuple[str, int]:
    end = body.index(b"\0", at)
    return body[at:end].decode("utf-8", "replace"), end + 1


def _bound_values(body: bytes, at: int) -> list[str]:
    """A Bind message's parameter values (text; a binary value decoded as far as it goes)."""
    (nformats,) = struct.unpack_from("!h", body, at)
    at += 2 + 2 * nformats
    (nparams,) = struct.unpack_from("!h", body, at)
    at += 2
    values = []
    for _ in range(nparams):
        (size,) = struct.unpack_from("!i", body, at)
        at += 4
        if size < 0:
            values.append("NULL")
            continue
        values.append(body[at : at + size].decode("utf-8", "replace"))
        at += size
    return values


def sql_fault(
    kind: FaultKind,
    pattern: str,
    *,
    params: str | None = None,
    nth: int = 1,
    seconds: float = 0.0,
    application: str | None = None,
    phase: str = "execute",
    stall_reply: bool = False,
    cut_all: bool = False,
    label: str | None = None,
) -> Fault:
    """A fault on the ``nth`` round trip whose SQL matches ``pattern`` (re.search, case
    insensitive, DOTALL), sent by a connection whose application_name matches
    ``application`` (a regex, fullmatch) if given, in ``phase`` ("execute": a simple query
    or an Execute; "parse": a prepare round trip; "any"), and whose bound values (or SQL
    text, for a simple query) match ``params`` if given."""
    regex = re.compile(pattern, re.IGNORECASE | re.DOTALL)
    values = re.compile(params) if params is not None else None
    app = re.compile(application) if application is not None else None

    def matches(rt: RoundTrip) -> bool:
        if phase != "any" and rt.phase != phase:
            return False
        if app is not None and not app.fullmatch(rt.application):
            return False
        if values is not None and not values.search(rt.params or rt.text):
            return False
        return regex.search(rt.text) is not None

    where = f" from {application}" if application else ""
    where += f" with /{params}/" if params else ""
    return Fault(
        kind,
        matches,
        label or f"SQL /{pattern}/{where}",
        nth=nth,
        seconds=seconds,
        stall_reply=stall_reply,
        cut_all=cut_all,
    )


def commit_fault(
    kind: FaultKind = LOSE_REPLY,
    *,
    after: str | None = None,
    application: str | None = None,
    refuse_after: float = 0.0,
) -> Fault:
    """A fault on the next COMMIT, or only on the COMMIT of a transaction that sent SQL
    matching ``after`` (re.search, case insensitive) on the same connection, not one the
    client commits before it. ``refuse_after``: see ``Fault``."""
    marker = re.compile(after, re.IGNORECASE | re.DOTALL) if after is not None else None
    ending = re.compile(r"^\s*(COMMIT|ROLLBACK)\b", re.IGNORECASE)
    app = re.compile(application) if application is not None else None
    pending: set[int] = set()  # connections whose open transaction sent ``after``

    def matches(rt: RoundTrip) -> bool:
        if app is not None and not app.fullmatch(rt.application):
            return False
        if marker is not None and marker.search(rt.text):
            pending.add(rt.connection)
        end = ending.match(rt.text)
        if end is None:
            return False
        sent = rt.connection in pending or marker is None
        pending.discard(rt.connection)
        return sent and end.group(1).upper() == "COMMIT"

    where = f" after /{after}/" if after else ""
    fault = Fault(kind, matches, f"COMMIT{where}")
    fault.refuse_after = refuse_after
    return fault


class PgProxy(Proxy):
    def __init__(self, upstream_host: str = "127.0.0.1", upstream_port: int = 5432) -> None:
        super().__init__(upstream_host, upstream_port)
        self._numbers = itertools.count(1)

    def url(self, database_url: str) -> str:
        """``database_url`` with its host and port replaced by this proxy's."""
        return re.sub(r"@[^/@]+(/|$)", f"@{self.host}:{self.port}\\1", database_url, count=1)

    async def _relay(
        self,
        creader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        sreader: asyncio.StreamReader,
        swriter: asyncio.StreamWriter,
    ) -> None:
        waiting: collections.deque[_Waiting] = collections.deque()
        connection = next(self._numbers)
        application = await self._startup(creader, cwriter, swriter)
        if application is None:
            # A cancel request: the server answers nothing and closes; pass it through.
            await swriter.drain()
            await sreader.read()
            return
        up = asyncio.ensure_future(
            self._frontend(creader, swriter, waiting, application, connection)
        )
        down = asyncio.ensure_future(self._backend(sreader, cwriter, waiting))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            up.cancel()
            down.cancel()

    async def _startup(
        self,
        creader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        swriter: asyncio.StreamWriter,
    ) -> str | None:
        while True:
            head = await creader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            body = await creader.readexactly(length - 8)
            if code in (SSL_REQUEST, GSS_REQUEST):
                cwriter.write(b"N")  # no encryption: the proxy must read the stream
                await cwriter.drain()
                continue
            swriter.write(head + body)
            if code == CANCEL_REQUEST:
                return None
            words = body.split(b"\0")
            params = dict(zip(words[::2], words[1::2], strict=False))
            return params.get(b"application_name", b"").decode("utf-8", "replace")

    async def _frontend(
        self,
        creader: asyncio.StreamReader,
        swriter: asyncio.StreamWriter,
        waiting: collections.deque[_Waiting],
        application: str,
        connection: int,
    ) -> None:
        statements: dict[str, str] = {}
        portals: dict[str, str] = {}
        bound: dict[str, list[str]] = {}
        values: list[str] = []
        held: list[bytes] = []
        executed: list[str] = []
        parsed: list[str] = []
        while True:
            head = await creader.readexactly(5)
            kind = head[0]
            (length,) = struct.unpack("!i", head[1:])
            body = await creader.readexactly(length - 4)
            raw = head + body
            if kind in EXTENDED:
                if kind == ord("P"):
                    name, at = _cstring(body, 0)
                    sql, _ = _cstring(body, at)
                    statements[name] = sql
                    parsed.append(sql)
                elif kind == ord("B"):
                    portal, at = _cstring(body, 0)
                    stmt, at = _cstring(body, at)
                    portals[portal] = stmt
                    bound[portal] = _bound_values(body, at)
                elif kind == ord("E"):
                    portal, _ = _cstring(body, 0)
                    executed.append(statements.get(portals.get(portal, ""), ""))
                    values.extend(bound.get(portal, []))
                elif kind == ord("C") and body[:1] == b"S":
                    statements.pop(_cstring(body, 1)[0], None)
                held.append(raw)
                continue
            if kind == ord("S"):
                held.append(raw)
                if executed:
                    rt = RoundTrip(
                        "; ".join(executed),
                        "execute",
                        application,
                        params=" ".join(values),
                        connection=connection,
                    )
                else:
                    rt = RoundTrip("; ".join(parsed), "parse", application, connection=connection)
                data = b"".join(held)
                held.clear()
                executed.clear()
                parsed.clear()
                values.clear()
            elif kind == ord("Q"):
                text = body[:-1].decode("utf-8", "replace")
                rt = RoundTrip(text, "execute", application, connection=connection)
                data = raw
            else:  # password, terminate, copy data: not a round trip a fault targets
                swriter.write(raw)
                await swriter.drain()
                if kind == ord("X"):
                    return
                continue
            fault = self.decide(rt)
            if fault is not None:
                await self.apply_before(fault)  # raises Cut for cut and refuse
            waiting.append(_Waiting(rt, fault))
            swriter.write(data)
            await swriter.drain()

    async def _backend(
        self,
        sreader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        waiting: collections.deque[_Waiting],
    ) -> None:
        held: list[bytes] = []
        while True:
            head = await sreader.readexactly(5)
            kind = head[0]
            (length,) = struct.unpack("!i", head[1:])
            raw = head + await sreader.readexactly(length - 4)
            current = waiting[0] if waiting else None
            fault = current.fault if current is not None else None
            if kind == ord("Z") and current is not None:
                waiting.popleft()
                if fault is not None and fault.kind == LOSE_REPLY:
                    # Executed (and, in autocommit or for COMMIT, committed): the client
                    # never learns it.
                    if fault.refuse_after:
                        self.turn_away_for(fault.refuse_after)
                    fault.fired.set()
                    raise Cut
                if fault is not None and fault.kind == STALL and fault.stall_reply:
                    fault.fired.set()
                    await asyncio.sleep(fault.seconds)
                    cwriter.write(b"".join(held) + raw)
                    held.clear()
                    await cwriter.drain()
                    continue
            elif fault is not None and fault.kind == LOSE_REPLY:
                continue
            elif fault is not None and fault.kind == STALL and fault.stall_reply:
                held.append(raw)
                continue
            cwriter.write(raw)
            await cwriter.drain()


__all__ = ["CUT", "LOSE_REPLY", "REFUSE", "STALL", "PgProxy", "commit_fault", "sql_fault"]
