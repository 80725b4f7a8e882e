"""The result streams: the relayer's publish, fenced by PostgreSQL's history, and the reading
of what was published, for the reconciliation of a new history.

Every result the relayer publishes carries the epoch of the PostgreSQL history its outbox row
was read from (``store.histories``). A reconciliation raises the queue's fence to the new
epoch before it reads the streams: from then on a publish from the lost history (a relayer
still holding rows it read from the old primary, or still connected to it) is refused as a
whole, so a call's published result is either one the reconciliation saw and adopted, or one
from the reconciled history.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis
from redis.client import Pipeline

from callgate.queue import transport

# KEYS: the fence, then each row's stream and published marks. ARGV: the epoch, the streams'
# time to live, then each row's outbox id and result. Rows come grouped by stream, so each
# stream's lifetime is set once, after its last entry. Returns -1 when the fence is past the
# epoch (nothing written), else each row's HSETNX reply (0: published before).
PUBLISH_LUA = """
local fence = tonumber(redis.call('GET', KEYS[1]) or '-1')
if fence > tonumber(ARGV[1]) then
    return -1
end
local first = {}
local rows = (#KEYS - 1) / 2
for i = 1, rows do
    local stream, marks = KEYS[2 * i], KEYS[2 * i + 1]
    redis.call('XADD', stream, '*', 'outbox_id', ARGV[1 + 2 * i], 'result', ARGV[2 + 2 * i])
    first[i] = redis.call('HSETNX', marks, ARGV[1 + 2 * i], 1)
    if i == rows or KEYS[2 * i + 2] ~= stream then
        redis.call('EXPIRE', stream, ARGV[2])
        redis.call('EXPIRE', marks, ARGV[2])
    end
end
return first
"""

# Raise the fence, never lower it: reconcilers of one history may race.
RAISE_FENCE_LUA = """
local now = tonumber(redis.call('GET', KEYS[1]) or '-1')
if now < tonumber(ARGV[1]) then
    redis.call('SET', KEYS[1], ARGV[1])
end
return tonumber(redis.call('GET', KEYS[1]))
"""


def fence_key(queue: str) -> str:
    """The epoch of the last PostgreSQL history reconciled for ``queue``."""
    return f"callgate:{queue}:pg_epoch"


@dataclass(frozen=True)
class Row:
    """One outbox row to publish: its id, turn and result (JSON text)."""

    id: int
    turn_id: uuid.UUID
    payload: str


class FencedOff(Exception):
    """A publish refused: its rows come from a PostgreSQL history older than the last one
    reconciled."""


def publish(connection: redis.Redis, queue: str, epoch: int, rows: Sequence[Row]) -> list[bool]:
    """Publish ``rows`` (read from the history ``epoch``) in one script; for each, whether
    this was its first publish. Raises ``FencedOff`` when the history is lost."""
    ordered = sorted(range(len(rows)), key=lambda i: str(rows[i].turn_id))
    keys = [fence_key(queue)]
    args: list[str | int] = [epoch, transport.RESULT_STREAM_TTL_SECONDS]
    for i in ordered:
        stream = transport.results_stream(queue, rows[i].turn_id)
        keys += [stream, transport.published_marks(stream)]
        args += [rows[i].id, rows[i].payload]
    with transport.translate_errors("relayer publish"):
        replies = connection.register_script(PUBLISH_LUA)(keys=keys, args=args)
    if replies == -1:
        raise FencedOff(
            f"results read from PostgreSQL history {epoch} were not published: a newer "
            "history has been reconciled (a failover); they are read again from it"
        )
    first = [False] * len(rows)
    for reply, i in zip(replies, ordered, strict=True):
        first[i] = bool(reply)
    return first


def raise_fence(connection: redis.Redis, queue: str, epoch: int) -> int:
    """Refuse from now on every publish from a history older than ``epoch``."""
    with transport.translate_errors("raise the results fence"):
        script = connection.register_script(RAISE_FENCE_LUA)
        return int(script(keys=[fence_key(queue)], args=[epoch]))


def fence(connection: redis.Redis, queue: str) -> int | None:
    """The epoch the results fence stands at: the last history any reconciler reached for
    ``queue`` (None: never raised)."""
    with transport.translate_errors("read the results fence"):
        value = connection.get(fence_key(queue))
    return None if value is None else int(value)


def published(
    connection: redis.Redis, queue: str, turns: Iterable[uuid.UUID]
) -> dict[tuple[uuid.UUID, str], str]:
    """Every result Redis holds for ``turns``, by (turn, call id): the first one published
    for each call, as fan-in reads it."""
    turns = list(dict.fromkeys(turns))
    found: dict[tuple[uuid.UUID, str], str] = {}
    for start in range(0, len(turns), 500):
        chunk = turns[start : start + 500]
        pipe = connection.pipeline(transaction=False)
        for turn in chunk:
            pipe.xrange(transport.results_stream(queue, turn))
        with transport.translate_errors("read published results"):
            streams = pipe.execute()
        for turn, entries in zip(chunk, streams, strict=True):
            for _, fields in entries:
                raw = fields.get(b"result")
                if raw is None:
                    continue
                text = raw.decode()
                call_id = json.loads(text).get("call_id")
                if isinstance(call_id, str):
                    found.setdefault((turn, call_id), text)
    return found


# How long Redis remembers a submitted turn: a failover to a replica that lags by more than
# this can lose a turn unnoticed (``collect`` then answers ``unknown_turn``).
RECENT_TURNS_SECONDS = 3600.0


def recent_turns_key(queue: str) -> str:
    """The turns submitted in the last ``RECENT_TURNS_SECONDS``, scored by submit time."""
    return f"callgate:{queue}:recent_turns"


@dataclass(frozen=True)
class Submitted:
    """A turn as Redis remembers it: enough to recognise it lost, and to keep its writes'
    operations in doubt (operation id, tool, idempotency key)."""

    turn_id: uuid.UUID
    tenant_id: str
    at: float
    writes: tuple[tuple[str, str, str], ...]
    # The user it was submitted for: the lost turn's owner (None in members written before
    # it was kept).
    user_id: str | None = None


def remember(pipe: Pipeline, queue: str, turn: Submitted) -> int:
    """Add to ``pipe`` the commands that note a submitted turn and forget those past the
    window; how many (the producer sends them in its enqueue's first round trip)."""
    member = json.dumps(
        {
            "turn": str(turn.turn_id),
            "tenant": turn.tenant_id,
            "user": turn.user_id,
            "writes": turn.writes,
        },
        separators=(",", ":"),
    )
    key = recent_turns_key(queue)
    pipe.zadd(key, {member: turn.at})
    pipe.zremrangebyscore(key, "-inf", f"({turn.at - RECENT_TURNS_SECONDS}")
    return 2


def recent(connection: redis.Redis, queue: str) -> list[Submitted]:
    """Every turn remembered, oldest first."""
    with transport.translate_errors("read recent turns"):
        entries: list[tuple[bytes, float]] = connection.zrange(  # type: ignore[assignment]
            recent_turns_key(queue), 0, -1, withscores=True
        )
    found = []
    for member, score in entries:
        raw = json.loads(member)
        writes = tuple((str(w[0]), str(w[1]), str(w[2])) for w in raw.get("writes", []))
        user = raw.get("user")
        found.append(
            Submitted(
                uuid.UUID(raw["turn"]),
                str(raw["tenant"]),
                float(score),
                writes,
                None if user is None else str(user),
            )
        )
    return found
