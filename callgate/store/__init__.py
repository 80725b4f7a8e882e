"""Postgres is callgate's source of truth: schema, migrations, reservations, outbox, trace.

Redis is only transport; the relayer (``callgate.daemons.relayer``) publishes committed
results to it.
"""
