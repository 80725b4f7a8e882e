"""What callgate reads of RQ's own storage, which RQ does not promise: all of it, here.

Producers enqueue through RQ's public API (``Queue.enqueue_many``), but the worker's consumer
takes jobs with its own Lua script (``deliveries.TAKE_LUA``) and decodes them itself, and the
sweeper asks Redis directly whether a job still waits. So callgate depends on:

- the job hash ``rq:job:<id>`` (``JOB_KEY_PREFIX`` + id), whose ``data`` field
  (``JOB_DATA_FIELD``) holds the job's call;
- ``data`` being ``zlib.compress(serializer.dumps((function, instance, args, kwargs)))``,
  with ``SERIALIZER`` JSON, so ``args[0]`` is the call ref (``job_args``);
- the queue's Redis list (``Queue.key``, ``rq:queue:<name>``) holding job ids, oldest first.

pyproject.toml caps RQ below its next major, and tests/integration/test_rq_contract.py
enqueues through callgate's own path and fails, naming the field, if a release changes any
of this.
"""

from __future__ import annotations

import json
import zlib
from typing import Any, Final

from rq.job import Job
from rq.serializers import JSONSerializer

# RQ's own prefix ("rq:job:" unless RQ_KEY_PREFIX is set), read from RQ so both agree.
JOB_KEY_PREFIX: Final[str] = Job.redis_job_namespace_prefix
# The job hash's field holding the compressed, serialised call.
JOB_DATA_FIELD: Final = "data"
# Jobs are JSON, not pickle: a job's data is readable by any process, and by this module.
SERIALIZER: Final = JSONSerializer


def job_key(job_id: str) -> str:
    """The Redis key of job ``job_id``'s hash."""
    return JOB_KEY_PREFIX + job_id


class JobDataError(ValueError):
    """A job's ``data`` is not a compressed JSON call tuple."""


def job_args(data: bytes) -> list[Any]:
    """The positional arguments of the call a job's ``data`` carries."""
    try:
        _function, _instance, args, _kwargs = json.loads(zlib.decompress(data))
    except (zlib.error, ValueError, TypeError) as exc:
        raise JobDataError(f"not an RQ JSON job ({type(exc).__name__}: {exc})") from exc
    if not isinstance(args, list):
        raise JobDataError(f"the job's args are a {type(args).__name__}, not a list")
    return args
