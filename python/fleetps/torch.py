"""PyTorch modules over FleetPS tables.

    import fleetps, fleetps.torch
    job = fleetps.init()
    emb = fleetps.torch.EmbeddingBag(job, table=0, mode="sum")   # rows on the servers
    mlp = torch.nn.Sequential(...)                               # a normal module
    dense = fleetps.torch.DenseParameters(job, 1, mlp.parameters())
    dense.initialize()
    for ids, x, y in batches:
        loss = loss_fn(mlp(torch.cat([emb(ids), x], 1)), y)
        mlp.zero_grad()
        loss.backward()            # emb pushes its rows' gradients from here
        dense.step(len(y))         # or a torch optimizer on mlp: each worker its own copy
    emb.flush(); dense.flush()

Embedding and EmbeddingBag hold no parameters: a forward pass pulls the rows
of the batch's unique keys (a torch.unique of the input), and backward
pushes each unique key's gradient (autograd sums a key's occurrences) scaled
by the communicator's gradient_scale, in the job's Distributed.mode:

  sync   the push of step s is sent from backward without waiting; the next
         forward waits until every worker's push of s was applied, so every
         worker reads the same parameters. One backward per training forward.
  async  the push is queued and merged with the next ones in the background
         (at most 2 * max_merge batches ahead: bounded staleness); prefetch()
         pulls the next batch while the current one computes.
  geo    the worker trains a local copy with the table's optimizer rule and
         exchanges deltas with the servers every k_steps pushes.

Keys are int64 tensors holding the uint64 key bits (torch has no uint64);
keys_tensor() turns a uint64 NumPy array into one without copying.
Evaluate under torch.no_grad() (or module.eval()): nothing is pushed then.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import fleetps


def keys_tensor(keys):
    """An int64 tensor sharing the bits of a uint64 NumPy array of keys."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    return torch.from_numpy(keys.view(np.int64))


class _SparseTable:
    """One sparse table through one communicator: what Embedding and
    EmbeddingBag share (pull of the unique keys, push from backward)."""

    def __init__(self, job, table, batch_size):
        info = job.table(table)
        if info["kind"] != "sparse":
            raise fleetps.InvalidArgument(f"Invalid argument: table {table} is {info['kind']}, "
                                          "an embedding needs a sparse table")
        self.dim = info["pull_dim"]
        self._ctr = info["accessor"] == "ctr"
        self._job = job
        self._table = table
        self._batch_size = batch_size
        self._comm = None      # made on the first batch (its size may be the batch size)
        self._pending = None   # the last push on its way (sync: applied once it returns)
        self._prefetched = None

    def _communicator(self, batch_samples):
        if self._comm is None:
            self._comm = self._job.communicator(
                sparse_table=self._table, batch_size=self._batch_size or max(batch_samples, 1))
        return self._comm

    def _wait_push(self):
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()

    @staticmethod
    def _unique(ids):
        unique, inverse, counts = torch.unique(ids.reshape(-1), return_inverse=True,
                                               return_counts=True)
        return unique.numpy().view(np.uint64), inverse.view(ids.shape), counts

    def prefetch(self, ids):
        if self._job.mode != "async":
            return False
        self._drop_prefetch()
        keys, inverse, counts = self._unique(ids)
        self._prefetched = (ids, keys, inverse, counts,
                            self._job.pull_sparse_async(self._table, keys))
        return True

    def _drop_prefetch(self):
        pre, self._prefetched = self._prefetched, None
        if pre is not None:
            pre[-1].result()  # the rows are not used, but the call must end

    def lookup(self, ids, batch_samples, clicks=None):
        """Rows [unique keys, dim] (a leaf whose gradient is pushed) and the
        index of each id's row, shaped like ids."""
        if ids.dtype != torch.int64:
            raise fleetps.InvalidArgument("Invalid argument: keys must be an int64 tensor "
                                          f"(uint64 bits; see keys_tensor), got {ids.dtype}")
        comm = self._communicator(batch_samples)
        self._wait_push()
        pre = self._prefetched
        if pre is not None and (pre[0] is ids or (pre[0].shape == ids.shape
                                                  and torch.equal(pre[0], ids))):
            self._prefetched = None
            _, keys, inverse, counts, future = pre
            values = future.result()
        else:
            self._drop_prefetch()
            keys, inverse, counts = self._unique(ids)
            values = comm.pull(keys)
        rows = torch.from_numpy(values)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            shows = clicks_per_key = None
            if self._ctr:
                shows = counts.to(torch.float32).numpy()
                clicks_per_key = np.zeros(len(keys), np.float32)
                if clicks is not None:
                    clicks_per_key = torch.zeros(len(keys)).index_add_(
                        0, inverse.reshape(-1), clicks.reshape(-1).to(torch.float32)).numpy()
            scale = comm.gradient_scale(batch_samples)
            rows.register_hook(
                lambda grad: self._push(keys, grad, scale, shows, clicks_per_key))
        return rows, inverse

    def _push(self, keys, grad, scale, shows, clicks):
        grads = (grad.to(torch.float32) * scale).contiguous().numpy()
        self._pending = self._comm.start_push(keys, grads, shows=shows, clicks=clicks)

    def flush(self):
        self._wait_push()
        self._drop_prefetch()
        if self._comm is not None:
            self._comm.flush()


class _SparseModule(nn.Module):
    def __init__(self, job, table, batch_size):
        super().__init__()
        self._sparse = _SparseTable(job, table, batch_size)
        self.table = table

    @property
    def embedding_dim(self):
        """Floats per key: the table's pull width."""
        return self._sparse.dim

    def prefetch(self, input):
        """Starts pulling the rows of `input` (the next batch: forward uses
        them when given an equal tensor) while the current step runs.
        True when started: async mode only; sync must read the step's update
        first, and geo reads its local copy."""
        return self._sparse.prefetch(input)

    def flush(self):
        """Waits for the pushes made so far (async: sent; geo: exchanged),
        e.g. before evaluating, saving or exiting."""
        self._sparse.flush()


class Embedding(_SparseModule):
    """nn.Embedding over a FleetPS sparse table: forward(input) returns
    input.shape + (embedding_dim,) rows.

    batch_size: samples per worker per step, for the sync gradient scale
    (default: the first batch's input.shape[0]). clicks (CTR accessor): a
    tensor shaped like input; each key's shows are its occurrences."""

    def __init__(self, job, table, batch_size=None):
        super().__init__(job, table, batch_size)

    def forward(self, input, clicks=None):
        samples = input.shape[0] if input.dim() > 0 else 1
        rows, inverse = self._sparse.lookup(input, samples, clicks)
        return F.embedding(inverse, rows)


class EmbeddingBag(_SparseModule):
    """nn.EmbeddingBag over a FleetPS sparse table: forward(input, offsets=None,
    per_sample_weights=None) pools each bag's rows ("sum", "mean" or "max"),
    with input 2-D (one bag per row) or 1-D with offsets, as nn.EmbeddingBag
    takes them. The bags are the samples of the sync gradient scale."""

    def __init__(self, job, table, mode="sum", batch_size=None):
        super().__init__(job, table, batch_size)
        self.mode = mode

    def forward(self, input, offsets=None, per_sample_weights=None, clicks=None):
        bags = input.shape[0] if input.dim() == 2 else (offsets.numel() if offsets is not None
                                                       else 1)
        rows, inverse = self._sparse.lookup(input, bags, clicks)
        return F.embedding_bag(inverse, rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights)


class DenseParameters:
    """Parameters of an ordinary PyTorch module kept in a FleetPS dense table
    (its dim must be their count), trained there by the table's optimizer
    rule in the job's mode, in place of a torch optimizer:

        dense = DenseParameters(job, 1, mlp.parameters())
        dense.initialize()     # worker 0's values for everyone
        ... loss.backward(); dense.step(batch_samples)   # push gradients, pull values
    """

    def __init__(self, job, table, parameters, batch_size=None):
        self._params = list(parameters)
        count = sum(p.numel() for p in self._params)
        info = job.table(table)
        if info["kind"] != "dense" or info["dim"] != count:
            raise fleetps.InvalidArgument(
                f"Invalid argument: table {table} ({info['kind']}, dim {info['dim']}) does not "
                f"hold these {count} parameters: make it a dense table with dim {count}")
        self._job = job
        self._table = table
        self._batch_size = batch_size
        self._comm = None
        self._values = np.zeros(count, np.float32)

    def _communicator(self, batch_samples):
        if self._comm is None:
            self._comm = self._job.communicator(
                dense_table=self._table, batch_size=self._batch_size or max(batch_samples, 1))
            # Geo's local copy starts from a pull (the parameters keep theirs).
            self._comm.pull(dense_out=self._values)
        return self._comm

    def initialize(self, write=True):
        """Worker 0 writes the module's current values (unless write=False:
        the servers loaded a checkpoint), every worker waits for it, then
        reads them."""
        if write and self._job.rank == 0:
            with torch.no_grad():
                flat = nn.utils.parameters_to_vector(self._params)
            self._job.init_dense(self._table, flat.to(torch.float32).numpy())
        self._job.barrier(f"fleetps_dense_init_{self._table}")
        self.pull()

    def pull(self):
        """The table's values (geo: the local copy) into the parameters."""
        if self._comm is None:
            # Before the first push every mode reads the servers; the
            # communicator is made then, with that batch's size (sync scale).
            self._job.pull_dense(self._table, out=self._values)
        else:
            self._comm.pull(dense_out=self._values)
        with torch.no_grad():
            nn.utils.vector_to_parameters(torch.from_numpy(self._values), self._params)

    def push(self, batch_samples):
        """The parameters' gradients of a batch-mean loss over batch_samples
        (None counts as zero), scaled for the mode and pushed."""
        comm = self._communicator(batch_samples)
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                           for p in self._params])
        scaled = (grads.to(torch.float32) * comm.gradient_scale(batch_samples)).numpy()
        comm.push(dense_grads=np.ascontiguousarray(scaled))

    def step(self, batch_samples):
        """push() then pull(): the optimizer step of this worker."""
        self.push(batch_samples)
        self.pull()

    def flush(self):
        if self._comm is not None:
            self._comm.flush()
