"""``fanin.Pacing``: the one decision both producers' fan-in loops take at each step."""

from __future__ import annotations

from callgate.producer.fanin import Next, Pacing


def test_reads_the_stream_until_the_recheck_then_postgres() -> None:
    p = Pacing(now=0.0, deadline=10.0, recheck=1.0)
    assert p.step(False, 0.0).next is Next.READ_STREAM
    assert p.step(False, 0.0).seconds == 1.0
    assert p.step(False, 1.0).next is Next.READ_POSTGRES
    p.postgres_read(1.0)
    assert p.step(False, 1.2).next is Next.READ_STREAM


def test_redis_away_means_postgres_now_and_redis_again_after_a_recheck() -> None:
    p = Pacing(now=0.0, deadline=None, recheck=1.0)
    p.redis_failed(0.3)
    assert p.step(False, 0.3).next is Next.READ_POSTGRES
    p.postgres_read(0.3)
    step = p.step(False, 0.4)
    assert step.next is Next.WAIT and abs(step.seconds - 0.9) < 1e-9
    assert p.step(False, 1.3).next is Next.READ_POSTGRES  # both due: PostgreSQL first
    p.postgres_read(1.3)
    assert p.step(False, 1.3).next is Next.READ_STREAM


def test_done_when_complete_or_out_of_time() -> None:
    p = Pacing(now=0.0, deadline=1.8, recheck=1.0)
    assert p.step(True, 0.0).next is Next.DONE
    assert p.step(False, 1.8).next is Next.DONE
    p.postgres_read(1.0)
    step = p.step(False, 1.5)
    assert step.next is Next.READ_STREAM and abs(step.seconds - 0.3) < 1e-9  # not past it
