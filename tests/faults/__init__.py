r"""A wire-level fault injector: TCP proxies in front of Postgres and Redis that tests control.

- ``pgproxy.PgProxy`` parses the frontend/backend message streams, so a fault can hit the
  Nth round trip whose SQL matches a pattern (a simple 'Q' query, or an extended-protocol
  Parse/Bind/Execute/Sync, with prepared statement names tracked back to their SQL).
- ``redisproxy.RedisProxy`` parses RESP commands and replies (pipelines included), so a fault
  can hit the Nth command with a given name and arguments.

Both offer the same faults (``core.Fault``): cut before send, executed with the reply lost,
connections refused for N seconds, and a round trip stalled for N seconds; and, by hand, a
server restart (``shut_for``/``open``), connections turned away (``reset_next``,
``turn_away_for``) and a blackholed path (``freeze``). ``pgproxy.commit_fault`` loses the
reply to one transaction's COMMIT; a Redis ``lose_reply`` may wait for a reply that matches.
Every test-local proxy went here: there is one of each.

The sweep (``sweep.py``, run by tests/integration/test_fault_matrix.py) puts them between
real callgate processes and the servers and arms one fault per cell:

    pytest tests/integration/test_fault_matrix.py            # the fast subset
    pytest tests/integration/test_fault_matrix.py -m slow    # the whole matrix

The matrix (round trip × fault → outcome) is printed at the end of the run and written with
each cell's evidence to ``<basetemp>/fault-matrix.md``. A fault armed on one round trip:

    pg_proxy.arm(sql_fault(LOSE_REPLY, r"^\s*COMMIT", application="callgate-producer"))
    redis_proxy.arm(command_fault(CUT, "XADD", args="c-unkeyed"))
"""
