"""A fencing token after a PostgreSQL failover is larger than every token before it, even when
the new history counts generations again from an earlier value."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from callgate.store.histories import fencing_token
from callgate.store.reservations import Reserved

GENERATION = st.integers(min_value=1, max_value=2**31 - 1)  # operations.generation is integer
EPOCH = st.integers(min_value=0, max_value=2**30)


@given(EPOCH, GENERATION, GENERATION)
def test_a_later_history_always_hands_out_larger_tokens(
    epoch: int, before: int, after: int
) -> None:
    assert fencing_token(epoch + 1, after) > fencing_token(epoch, before)


@given(EPOCH, GENERATION, GENERATION)
def test_within_a_history_tokens_follow_the_generation(epoch: int, a: int, b: int) -> None:
    assert (fencing_token(epoch, a) < fencing_token(epoch, b)) == (a < b)


def test_the_first_history_keeps_the_generation_as_the_token() -> None:
    assert Reserved(7, takeover=False).fencing_token == 7
    assert Reserved(7, takeover=False, epoch=1).fencing_token == 2**32 + 7
