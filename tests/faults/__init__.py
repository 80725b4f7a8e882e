"""A wire-level fault injector: TCP proxies in front of Postgres and Redis that tests control.

- ``pgproxy.PgProxy`` parses the frontend/backend message streams, so a fault can hit the
  Nth round trip whose SQL matches a pattern (a simple 'Q' query, or an extended-protocol
  Parse/Bind/Execute/Sync, with prepared statement names tracked back to their SQL).
- ``redisproxy.RedisProxy`` parses RESP commands and replies (pipelines included), so a fault
  can hit the Nth command with a given name and arguments.

Both offer the same faults (``core.Fault``): cut before send, executed with the reply lost,
connections refused for N seconds, and a round trip stalled for N seconds.
"""
