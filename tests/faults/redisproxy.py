"""A Redis proxy that reads RESP commands and replies, so a fault can hit one command.

The commands read together from a client (a pipeline: N commands, then N replies) travel as
one round trip; a fault that matches any of them acts on the whole batch, as a network fault
would. Replies are parsed (RESP2 and RESP3 values) to know where each ends. A connection
that subscribes is passed through untouched from then on.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tests.faults.core import LOSE_REPLY, STALL, Cut, Fault, FaultKind, Proxy, RoundTrip

SUBSCRIBING = frozenset({b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"MONITOR"})


class Incomplete(Exception):
    pass


def parse_command(buf: bytes | bytearray, at: int) -> tuple[tuple[bytes, ...], int]:
    """One client command starting at ``at``: its words and where the next begins."""
    if buf[at : at + 1] != b"*":  # an inline command
        end = buf.find(b"\r\n", at)
        if end < 0:
            raise Incomplete
        return tuple(bytes(buf[at:end]).split()), end + 2
    end = buf.find(b"\r\n", at)
    if end < 0:
        raise Incomplete
    count = int(buf[at + 1 : end])
    pos = end + 2
    words: list[bytes] = []
    for _ in range(count):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            raise Incomplete
        size = int(buf[pos + 1 : end])
        start = end + 2
        if len(buf) < start + size + 2:
            raise Incomplete
        words.append(bytes(buf[start : start + size]))
        pos = start + size + 2
    return tuple(words), pos


def reply_end(buf: bytes | bytearray, at: int) -> int:
    """Where the RESP value starting at ``at`` ends (raises Incomplete)."""
    end = buf.find(b"\r\n", at)
    if end < 0:
        raise Incomplete
    kind = buf[at : at + 1]
    if kind in (b"+", b"-", b":", b"_", b",", b"#", b"("):
        return end + 2
    if kind in (b"$", b"!", b"="):
        size = int(buf[at + 1 : end])
        if size < 0:
            return end + 2
        if len(buf) < end + 2 + size + 2:
            raise Incomplete
        return end + 2 + size + 2
    if kind in (b"*", b"~", b">", b"%", b"|"):
        count = int(buf[at + 1 : end])
        if count < 0:
            return end + 2
        if kind in (b"%", b"|"):
            count *= 2
        pos = end + 2
        for _ in range(count):
            pos = reply_end(buf, pos)
        if kind == b"|":  # an attribute precedes the value it describes
            return reply_end(buf, pos)
        return pos
    raise ValueError(f"not a RESP value: {bytes(buf[at : at + 20])!r}")


@dataclass
class _Batch:
    rt: RoundTrip
    replies: int
    fault: Fault | None


def command_fault(
    kind: FaultKind,
    command: str,
    *,
    args: str | None = None,
    nth: int = 1,
    seconds: float = 0.0,
    stall_reply: bool = False,
    cut_all: bool = False,
    stall_all: bool = False,
    reply_matches: Callable[[bytes], bool] | None = None,
    label: str | None = None,
) -> Fault:
    """A fault on the ``nth`` batch holding command ``command`` (any case) whose arguments,
    joined by spaces, match ``args`` (re.search) if given. ``reply_matches`` (lose_reply):
    the first such batch whose replies satisfy it, instead."""
    name = command.upper().encode()
    regex = re.compile(args.encode(), re.DOTALL) if args is not None else None

    def matches(rt: RoundTrip) -> bool:
        for words in rt.commands:
            if (words and words[0].upper() == name) and (
                regex is None or regex.search(b" ".join(words[1:]))
            ):
                return True
        return False

    return Fault(
        kind,
        matches,
        label or (f"{command} /{args}/" if args else command),
        nth=nth,
        seconds=seconds,
        stall_reply=stall_reply,
        cut_all=cut_all,
        stall_all=stall_all,
        reply_matches=reply_matches,
    )


def script_fault(kind: FaultKind, script: str, **options: object) -> Fault:
    """A fault on a Lua script's call: EVALSHA of its SHA1, or EVAL of its text."""
    sha = hashlib.sha1(script.encode()).hexdigest()
    label = options.pop("label", None) or f"script {sha[:8]}"
    fault = command_fault(kind, "EVALSHA", args=f"^{sha}", label=str(label), **options)  # type: ignore[arg-type]
    by_sha = fault.matches
    by_text = command_fault(kind, "EVAL", args=f"^{re.escape(script[:40])}").matches
    fault.matches = lambda rt: by_sha(rt) or by_text(rt)
    return fault


class RedisProxy(Proxy):
    def __init__(self, upstream_host: str = "127.0.0.1", upstream_port: int = 6379) -> None:
        super().__init__(upstream_host, upstream_port)

    def url(self, redis_url: str) -> str:
        return re.sub(r"//([^/@]*@)?[^/@]+", f"//\\g<1>{self.host}:{self.port}", redis_url, count=1)

    async def _relay(
        self,
        creader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        sreader: asyncio.StreamReader,
        swriter: asyncio.StreamWriter,
    ) -> None:
        waiting: collections.deque[_Batch] = collections.deque()
        passthrough = asyncio.Event()
        up = asyncio.ensure_future(self._frontend(creader, swriter, waiting, passthrough))
        down = asyncio.ensure_future(self._backend(sreader, cwriter, waiting, passthrough))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            up.cancel()
            down.cancel()

    async def _frontend(
        self,
        creader: asyncio.StreamReader,
        swriter: asyncio.StreamWriter,
        waiting: collections.deque[_Batch],
        passthrough: asyncio.Event,
    ) -> None:
        buf = bytearray()
        while True:
            chunk = await creader.read(65536)
            if not chunk:
                return
            await self.hold()
            if passthrough.is_set():
                swriter.write(chunk)
                await swriter.drain()
                continue
            buf += chunk
            commands: list[tuple[bytes, ...]] = []
            pos = 0
            try:
                while pos < len(buf):
                    words, pos = parse_command(buf, pos)
                    if words:
                        commands.append(words)
            except Incomplete:
                pass
            if not commands:
                continue
            await self.hold()
            data = bytes(buf[:pos])
            del buf[:pos]
            rt = RoundTrip(_describe(commands), "redis", commands=tuple(commands))
            fault = self.decide(rt)
            if fault is not None:
                await self.apply_before(fault)
            if any(c[0].upper() in SUBSCRIBING for c in commands):
                passthrough.set()
            else:
                waiting.append(_Batch(rt, len(commands), fault))
            swriter.write(data)
            await swriter.drain()

    async def _backend(
        self,
        sreader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        waiting: collections.deque[_Batch],
        passthrough: asyncio.Event,
    ) -> None:
        buf = bytearray()
        held = bytearray()
        while True:
            chunk = await sreader.read(65536)
            if not chunk:
                return
            await self.hold()
            if passthrough.is_set() and not waiting:
                cwriter.write(bytes(buf) + chunk)
                buf.clear()
                await cwriter.drain()
                continue
            buf += chunk
            out = bytearray()
            pos = 0
            while pos < len(buf) and waiting:
                try:
                    end = reply_end(buf, pos)
                except Incomplete:
                    break
                if buf[pos : pos + 1] == b">":  # a RESP3 push: not a reply
                    out += buf[pos:end]
                    pos = end
                    continue
                batch = waiting[0]
                batch.replies -= 1
                fault = batch.fault
                if fault is not None and fault.reply_matches is not None:
                    held += buf[pos:end]  # dropped or passed on once the batch is whole
                elif fault is not None and fault.kind == LOSE_REPLY:
                    fault.dropped += buf[pos:end]  # dropped (kept for the evidence)
                elif fault is not None and fault.kind == STALL and fault.stall_reply:
                    held += buf[pos:end]
                else:
                    out += buf[pos:end]
                pos = end
                if batch.replies == 0:
                    waiting.popleft()
                    if fault is not None and fault.reply_matches is not None:
                        replies = bytes(held)
                        held.clear()
                        if fault.reply_matches(replies) and self.fire(fault, batch.rt):
                            fault.dropped += replies
                            cwriter.write(bytes(out))
                            await cwriter.drain()
                            fault.fired.set()
                            raise Cut
                        out += replies
                    elif fault is not None and fault.kind == LOSE_REPLY:
                        cwriter.write(bytes(out))
                        await cwriter.drain()
                        fault.fired.set()
                        raise Cut
                    if fault is not None and fault.kind == STALL and fault.stall_reply:
                        cwriter.write(bytes(out))
                        out.clear()
                        await cwriter.drain()
                        fault.fired.set()
                        await asyncio.sleep(fault.seconds)
                        out += held
                        held.clear()
            del buf[:pos]
            if passthrough.is_set() and not waiting:
                out += buf
                buf.clear()
            if out:
                cwriter.write(bytes(out))
                await cwriter.drain()


def _describe(commands: Sequence[tuple[bytes, ...]]) -> str:
    return "; ".join(
        " ".join(w.decode("utf-8", "replace")[:60] for w in words[:4]) for words in commands
    )


__all__ = ["LOSE_REPLY", "STALL", "RedisProxy", "command_fault", "script_fault"]
