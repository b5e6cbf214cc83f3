"""FleetPS's parameter servers from Python: sparse and dense tables pulled and
pushed by key with NumPy arrays, in the job's sync, async or geo mode.

    import fleetps
    job = fleetps.init()                          # under fleetrun: the job's environment
    rows = job.pull_sparse(0, keys)               # float32 [len(keys), pull_dim]
    job.push_sparse(0, keys, grads, step=0)

fleetps.torch holds the PyTorch layer (Embedding, EmbeddingBag, DenseParameters).
python/README.md has the whole API; every call is a thin layer over FleetPS's C++
worker API (ps/client.h, worker/communicator.h).
"""

import atexit
import weakref

from fleetps._fleetps import (  # noqa: F401  (re-exported)
    Communicator,
    Corruption,
    Error,
    FailedPrecondition,
    Future,
    InvalidArgument,
    IOError,
    Job,
    NotFound,
    PendingPush,
    Progress,
    Timeout,
    Unavailable,
)

__all__ = [
    "init", "Job", "Communicator", "Future", "PendingPush", "Progress", "Error", "InvalidArgument",
    "NotFound", "Timeout", "Unavailable", "FailedPrecondition", "Corruption", "IOError",
]

# Jobs still open at exit are closed then (their communicators flush), before
# the interpreter tears down what their threads use.
_open_jobs = weakref.WeakSet()


@atexit.register
def _close_open_jobs():
    for job in list(_open_jobs):
        job.close()


def _text(value):
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def init(*, servers=None, config=None, overrides=None, rank=None, world_size=None,
         kv_endpoint=None, job_id=None, secret_file=None, auth=None, timeout_ms=0):
    """Joins the parameter-server job as a worker and returns its Job.

    Under fleetrun (`fleetrun --server_num=2 --worker_num=2 --config=job.yaml
    python3 train.py`) call it without arguments: the job comes from the FLEET_*
    environment fleetrun gives each worker (servers, rank, KV store, config,
    -o overrides, and the job secret). By hand, give what fleetrun would; each
    argument wins over its variable:

      servers      "ip:port,..." or a list (FLEET_SERVERS); port 0 entries are
                   read from the KV store, where servers publish them
      config       the job YAML (FLEET_CONFIG); overrides: ["Key.sub=value", ...]
                   (FLEET_OVERRIDES)
      rank, world_size   this worker's rank among world_size workers
                   (FLEET_RANK, FLEET_WORLD_SIZE); several need kv_endpoint
      kv_endpoint  "ip:port" of the KV store (fleetrun --store_only hosts one)
      job_id       FLEET_JOB_ID
      secret_file  a file holding the job secret, mode 600
                   (FLEET_JOB_SECRET_FILE); else FLEET_JOB_SECRET
      auth         False only on a trusted network (FLEET_AUTH=off)
      timeout_ms   how long to wait for the servers' endpoints (default: the
                   job's Distributed.timeout_ms)

    Raises fleetps.InvalidArgument for a bad value, a missing config, no
    servers, or auth on without the job's secret (FleetPS's message says how to
    give one); fleetps.Timeout when servers never published their endpoints.
    """
    given = {
        "FLEET_SERVERS": servers,
        "FLEET_CONFIG": config,
        "FLEET_OVERRIDES": ";".join(overrides) if overrides is not None else None,
        "FLEET_RANK": rank,
        "FLEET_WORLD_SIZE": world_size,
        "FLEET_KV_ENDPOINT": kv_endpoint,
        "FLEET_JOB_ID": job_id,
        "FLEET_JOB_SECRET_FILE": secret_file,
        "FLEET_AUTH": auth,
    }
    env = {name: _text(value) for name, value in given.items() if value is not None}
    job = Job._join(env, int(timeout_ms))
    _open_jobs.add(job)
    return job
