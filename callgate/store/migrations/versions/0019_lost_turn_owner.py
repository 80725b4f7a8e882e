"""Whose turn a lost turn was: its tenant and user.

A turn a failover lost is answered ``turn_lost`` by ``collect``, but the HTTP API answers a
turn only to the principal it was submitted for, and the record of a lost turn kept no
principal: its owner got ``unknown_turn`` (404), as if it had never been submitted. The
tenant and user Redis remembers with each submitted turn are now kept with the lost turn, so
its owner gets ``turn_lost`` (410) and anyone else the 404 of an unknown id. Nullable columns
with no default (no table rewrite): turns lost before this, or remembered by Redis before the
upgrade without a user, have no owner the API can match, and stay 404 over HTTP (``callgate
collect`` still answers ``turn_lost`` for them).

Revision ID: 0019
Revises: 0018
"""

from alembic import op

revision = "0019"
down_revision = "0018"


def upgrade() -> None:
    op.execute("ALTER TABLE callgate.lost_turns ADD COLUMN tenant_id text, ADD COLUMN user_id text")
