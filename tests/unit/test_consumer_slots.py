"""The consumer's slot bookkeeping, on real threads: a delivery made again after an outage
that takes a slot while the consumer gathers free slots leaves it none to fill (found by
review: the consumer computed -1 free slots, took a call anyway and let a waiter in)."""

from __future__ import annotations

import threading
import time

import pytest

from callgate.worker import consumer


def test_a_slot_taken_during_the_gather_leaves_the_take_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(consumer, "GATHER_SECONDS", 0.3)  # a window the test can land in
    c = consumer.Consumer.__new__(consumer.Consumer)  # the bookkeeping only: no Redis, no PG
    c.concurrency, c.in_flight = 4, 5
    c._handling, c._taking, c._waiting = {"a", "b", "c"}, 0, 0
    c._slots, c._stopping = threading.Condition(), threading.Event()
    got: list[int] = []
    main = threading.Thread(target=lambda: got.append(c._wait_for_free_slot()))
    main.start()
    time.sleep(0.05)  # the consumer waits in the gather: 1 free, it wants 2
    c._take_slot("D")  # made again: takes the last slot
    waiter = threading.Thread(target=c._take_slot, args=("E",), daemon=True)
    waiter.start()  # made again too: waits
    main.join(5)
    assert got == [0] and c._taking == 0
    with c._slots:
        c._slots.notify_all()
    waiter.join(0.5)
    assert waiter.is_alive() and len(c._handling) == 4  # never more than K
    with c._slots:  # a handler ends: the waiter has its slot
        c._handling.discard("a")
        c._slots.notify_all()
    waiter.join(5)
    assert not waiter.is_alive() and c._handling == {"b", "c", "D", "E"}
