"""``fanin.follow``: the one fan-in loop, driven here by a script instead of Redis and
PostgreSQL, on a clock the test moves. Counts what the loop asks for, in order."""

from __future__ import annotations

import json
from typing import Any

import redis.exceptions

from callgate.producer.fanin import (
    FanIn,
    Landed,
    ReadPostgres,
    ReadStream,
    Request,
    Sleep,
    advance,
    follow,
)

PROPOSALS = [("a", "get_weather"), ("b", "get_stock")]


def _result(call_id: str, tool: str) -> dict[str, Any]:
    return {"call_id": call_id, "tool_name": tool, "status": "succeeded", "data": {}}


def _entry(n: int, raw: dict[str, Any]) -> tuple[bytes, dict[bytes, bytes]]:
    return f"{n}-0".encode(), {b"result": json.dumps(raw).encode()}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_redis_away_reads_postgres_then_the_stream_from_the_start() -> None:
    clock = Clock()
    fan = FanIn(PROPOSALS)
    loop = follow(fan, "s", [_result("a", "get_weather")], None, recheck=1.0, clock=clock)
    asked: list[Request] = []
    request = advance(loop)
    while request is not None:
        asked.append(request)
        if isinstance(request, ReadStream) and len(asked) == 2:
            request = advance(loop, error=redis.exceptions.ConnectionError("refused"))
        elif isinstance(request, ReadPostgres):
            request = advance(loop, [_result("a", "get_weather")])  # only the one it had
        elif isinstance(request, Sleep):
            clock.now += request.seconds
            request = advance(loop)
        elif isinstance(request, ReadStream):
            request = advance(loop, [("s", [_entry(7, _result("b", "get_stock"))])])
        else:
            request = advance(loop)
    assert [type(r).__name__ for r in asked] == [
        "Landed",  # what the first read found
        "ReadStream",  # refused
        "ReadPostgres",  # at once
        "Sleep",  # Redis is given a recheck period
        "ReadPostgres",
        "ReadStream",
        "Landed",
    ]
    assert asked[1] == ReadStream("s", "0-0", 1000)
    assert isinstance(asked[3], Sleep) and asked[3].seconds == 1.0
    assert asked[5] == ReadStream("s", "0-0", 1000)  # from the start again: copies are dropped
    assert [r.result.call_id for r in asked if isinstance(r, Landed)] == ["a", "b"]
    assert fan.complete and fan.duplicates == 2


def test_stops_at_the_deadline_with_calls_pending() -> None:
    clock = Clock()
    fan = FanIn(PROPOSALS)
    loop = follow(fan, "s", [], 2.5, recheck=1.0, clock=clock)
    asked: list[Request] = []
    request = advance(loop)
    while request is not None:
        asked.append(request)
        if isinstance(request, ReadStream):
            clock.now += request.block_ms / 1000  # nothing arrived within the block
        request = advance(loop, None)
    assert [type(r).__name__ for r in asked] == [
        "ReadStream",
        "ReadPostgres",
        "ReadStream",
        "ReadPostgres",
        "ReadStream",
    ]
    assert [r.block_ms for r in asked if isinstance(r, ReadStream)] == [1000, 1000, 500]
    assert fan.pending == ["a", "b"]
