"""The worker program of fleetps_test's fleetrun jobs (tests/python/tables.yaml,
sync mode, 2 workers):

  fleetps_job.py roundtrip OUT_DIR REFERENCE_CLIENT
      worker 1 becomes the C++ reference client (reference_client.cc);
      worker 0 makes the same steps through fleetps and checks that both
      read the same rows, that duplicate keys' gradients are summed, and the
      dense table's update, then saves and loads a checkpoint under
      OUT_DIR/ckpt (fleetrun -o server.save_dir=OUT_DIR/ckpt); it writes
      OUT_DIR/checked when all held.
  fleetps_job.py torch OUT_DIR
      both workers train one step of a fleetps.torch.EmbeddingBag on their
      half of a batch (sync, or async with -o Distributed.mode=async: then
      prefetched; geo: only checked to reach the servers), and of a linear layer in dense table 1
      (fleetps.torch.DenseParameters); worker 0 checks the rows and the
      layer against local ones trained on the whole batch, and that a
      second forward reads the rows; it writes OUT_DIR/checked when all held.
  fleetps_job.py killed OUT_DIR
      worker 0 waits at a barrier that never completes (fleetrun stops it)
      while a thread of its writes OUT_DIR/ran_during_barrier (the GIL is
      released); worker 1 then kills itself with SIGKILL.

Exits 1 with the reason on stderr when a check fails.
"""

import os
import signal
import sys
import threading
import time

import numpy as np

import fleetps

SPARSE, DENSE = 0, 1
SPARSE_LR, DENSE_LR = 0.5, 0.25  # tables.yaml


def keys():
    return np.array([1, 2, 3, 977, 123456789012345, (1 << 63) + 5, (1 << 64) - 1], np.uint64)


def cpp_sparse_grads(rows, dim):
    """reference_client.cc's SparseGrads."""
    i = np.arange(1, rows + 1, dtype=np.float32)[:, None]
    d = np.arange(1, dim + 1, dtype=np.float32)[None, :]
    return np.float32(0.01) * i * d


def cpp_dense_grads(dim):
    return np.float32(0.5) - np.float32(0.1) * np.arange(dim, dtype=np.float32)


def read_f32(out_dir, name, shape):
    return np.fromfile(os.path.join(out_dir, name + ".f32"), np.float32).reshape(shape)


def expect_equal(what, got, want, exact=False):
    ok = np.array_equal(got, want) if exact else np.allclose(got, want, rtol=1e-6, atol=1e-6)
    if not ok:
        sys.exit(f"fleetps_job: {what} differ:\n got {got}\nwant {want}")


def roundtrip(out_dir, reference_client):
    if os.environ.get("FLEET_RANK") == "1":
        os.execv(reference_client, [reference_client, out_dir])
    job = fleetps.init()
    k = keys()
    dim = job.table(SPARSE)["pull_dim"]

    initial = job.pull_sparse(SPARSE, k)
    # The buffer protocol: a uint64 array is read in place, a Python list is
    # converted, and out= is written in place.
    again = np.empty_like(initial)
    job.pull_sparse_async(SPARSE, k.tolist(), out=again).result()
    expect_equal("pull_sparse and pull_sparse_async(out=) rows", again, initial, exact=True)
    # Bad arguments raise the class of FleetPS's status code, with its message.
    bad_calls = [
        (lambda: job.pull_sparse(SPARSE, k, out=np.empty(initial.shape)), fleetps.InvalidArgument,
         "float32"),
        (lambda: job.pull_sparse(SPARSE, k, out=np.empty((1, dim), np.float32)),
         fleetps.InvalidArgument, "wrong size"),
        (lambda: job.push_sparse(SPARSE, k, np.zeros((len(k), dim + 1), np.float32), step=0),
         fleetps.InvalidArgument, f"need {len(k) * dim} floats"),
        (lambda: job.pull_dense(99), fleetps.NotFound, "no such table"),
        (lambda: job.pull_sparse(99, k), fleetps.NotFound, "99"),
    ]
    for call, error, words in bad_calls:
        try:
            call()
            sys.exit(f"fleetps_job: no {error.__name__} raised (want one saying {words!r})")
        except error as e:
            if words not in str(e):
                sys.exit(f"fleetps_job: {error.__name__} says {e}, want {words!r} in it")
    job.barrier("pulled_initial")
    expect_equal("rows pulled by fleetps and by the C++ client",
                 initial, read_f32(out_dir, "sparse_initial", initial.shape), exact=True)

    # Worker 0 pushes keys 0, 3, 6 several times: their gradients add up.
    picks = np.array([0, 3, 0, 6, 3, 0])
    grads = np.arange(len(picks) * dim, dtype=np.float32).reshape(len(picks), dim) / 10
    # The step's progress, reported to fleetrun as ps_worker reports it.
    progress = job.progress(total_steps=1, steps_per_epoch=1, samples_per_step=len(picks),
                            every_s=0.001)
    progress.step(0)
    job.push_sparse(SPARSE, k[picks], grads, step=0)
    time.sleep(0.002)
    progress.step(1)
    job.barrier("pushed_sparse")
    merged = np.zeros_like(initial)
    np.add.at(merged, picks, grads)
    want = initial - SPARSE_LR * (merged + cpp_sparse_grads(len(k), dim))
    updated = job.pull_sparse(SPARSE, k)
    expect_equal("rows after both workers' pushes (duplicates summed)", updated, want)

    dense_dim = job.table(DENSE)["dim"]
    start = np.linspace(-1, 1, dense_dim, dtype=np.float32)
    job.init_dense(DENSE, start)
    job.barrier("dense_initialized")  # also: the C++ client wrote its updated rows
    expect_equal("updated rows read by fleetps and by the C++ client",
                 updated, read_f32(out_dir, "sparse_updated", updated.shape), exact=True)
    mine = np.full(dense_dim, 2, np.float32)
    job.push_dense_async(DENSE, mine, step=0).result()
    job.barrier("pushed_dense")
    dense = job.pull_dense(DENSE)
    expect_equal("dense values", dense, start - DENSE_LR * (mine + cpp_dense_grads(dense_dim)))
    job.barrier("written")
    expect_equal("dense values read by fleetps and by the C++ client",
                 dense, read_f32(out_dir, "dense_updated", dense.shape), exact=True)

    # Checkpoints go only under the job's save dirs (fleetrun -o
    # server.save_dir=OUT_DIR/ckpt); the refusal is FleetPS's, as an exception.
    try:
        job.save(os.path.join(out_dir, "elsewhere"))
        sys.exit("fleetps_job: a save outside server.save_dir was not refused")
    except fleetps.InvalidArgument as e:
        if "save refused" not in str(e):
            sys.exit(f"fleetps_job: the refused save says {e}")
    checkpoint = os.path.join(out_dir, "ckpt", "after_step")
    job.save(checkpoint)
    job.init_dense(DENSE, np.zeros(dense_dim, np.float32))
    job.load(checkpoint)
    expect_equal("dense values loaded back", job.pull_dense(DENSE), dense, exact=True)
    expect_equal("rows loaded back", job.pull_sparse(SPARSE, k), updated, exact=True)

    stats = job.stats()
    rows = sum(t["rows"] for server in stats for t in server["tables"] if t["table_id"] == SPARSE)
    if len(stats) != job.num_servers or rows != len(k):
        sys.exit(f"fleetps_job: stats() shows {rows} sparse rows on {len(stats)} servers: {stats}")
    open(os.path.join(out_dir, "checked"), "w").close()


def torch_step(out_dir):
    import torch
    import fleetps.torch

    job = fleetps.init()
    # 8 bags of 3 ids over 6 keys (bag 2 holds key 2**63 twice); worker r
    # trains bags r, r + 2, ...
    key_values = keys()[[0, 1, 3, 4, 5, 6]]
    bag_ids = np.array([[0, 1, 2], [2, 3, 3], [4, 4, 1], [5, 0, 3],
                        [1, 1, 1], [3, 4, 5], [0, 2, 4], [5, 5, 0]])
    target = torch.linspace(-1, 1, len(bag_ids))
    mine = slice(job.rank, None, job.world_size)
    emb = fleetps.torch.EmbeddingBag(job, SPARSE, mode="sum")
    initial = job.pull_sparse(SPARSE, key_values)
    job.barrier("pulled_initial")

    def loss_of(pooled, target):
        return ((pooled.sum(1) - target) ** 2).mean()

    # A 4 -> 2 linear layer (10 parameters: dense table 1) beside it.
    torch.manual_seed(1)
    linear = torch.nn.Linear(4, 2)
    features = torch.linspace(-1, 1, len(bag_ids) * 4).reshape(len(bag_ids), 4)
    start = [p.detach().clone() for p in linear.parameters()]
    dense = fleetps.torch.DenseParameters(job, DENSE, linear.parameters())
    dense.initialize()

    my_bags = fleetps.torch.keys_tensor(key_values[bag_ids[mine]])
    # Only async pulls ahead: sync must read the step's update first.
    started = emb.prefetch(my_bags)
    if started != (job.mode == "async"):
        sys.exit(f"fleetps_job: prefetch in {job.mode} mode returned {started}")
    loss = loss_of(emb(fleetps.torch.keys_tensor(key_values[bag_ids[mine]])), target[mine])
    dense_loss = loss_of(linear(features[mine]), target[mine])
    # Async: neither worker's gradient may see the other's update.
    job.barrier("pulled_step")
    loss.backward()
    dense_loss.backward()
    dense.push(len(target[mine]))
    emb.flush()
    dense.flush()
    job.barrier("pushed")
    dense.pull()
    if job.mode == "geo":
        # Local copies trained and their deltas exchanged (worker/'s tests
        # hold the geo values): the step reached the servers.
        rows, values = job.pull_sparse(SPARSE, key_values), job.pull_dense(DENSE)
        if np.allclose(rows, initial) or np.allclose(values, np.concatenate(
                [v.reshape(-1).numpy() for v in start])):
            sys.exit("fleetps_job: a geo step did not reach the servers")
        if job.rank == 0:
            open(os.path.join(out_dir, "checked"), "w").close()
        return
    local = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(initial), freeze=False,
                                                  mode="sum")
    loss_of(local(torch.from_numpy(bag_ids)), target).backward()
    # Sync: the servers sum gradients scaled to the global batch's mean, as the
    # local step on the whole batch; async applies each worker's own mean.
    steps = 1 if job.mode == "sync" else job.world_size
    with torch.no_grad():
        want = (local.weight - SPARSE_LR * steps * local.weight.grad).numpy()
    expect_equal(f"rows after a {job.mode} step of both workers' halves and the local model's step",
                 job.pull_sparse(SPARSE, key_values), want)
    local_linear = torch.nn.Linear(4, 2)
    with torch.no_grad():
        for p, v in zip(local_linear.parameters(), start):
            p.copy_(v)
    loss_of(local_linear(features), target).backward()
    for name, p, local_p in zip(("weight", "bias"), linear.parameters(),
                                local_linear.parameters()):
        expect_equal(f"the linear layer's {name} after the {job.mode} step",
                     p.detach().numpy(),
                     (local_p - DENSE_LR * steps * local_p.grad).detach().numpy())
    all_bags = fleetps.torch.keys_tensor(key_values[bag_ids])
    emb.prefetch(all_bags)
    with torch.no_grad():
        pooled = emb(fleetps.torch.keys_tensor(key_values[bag_ids]))
    expect_equal("a second forward's bags", pooled.numpy(), want[bag_ids].sum(1))
    if job.rank == 0:
        open(os.path.join(out_dir, "checked"), "w").close()


def killed(out_dir):
    job = fleetps.init()
    job.barrier("joined")
    ran = os.path.join(out_dir, "ran_during_barrier")
    if job.rank == 1:
        # Dies once worker 0's thread ran while worker 0 waited in a barrier.
        deadline = time.monotonic() + 30
        while not os.path.exists(ran):
            if time.monotonic() > deadline:
                sys.exit("fleetps_job: no Python thread ran during a barrier (the GIL was held)")
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    waiting = threading.Event()

    def run_while_waiting():
        waiting.wait()
        time.sleep(0.2)  # the main thread is inside barrier() by now
        open(ran, "w").close()

    threading.Thread(target=run_while_waiting, daemon=True).start()
    waiting.set()
    job.barrier("never", timeout_ms=60000)


if __name__ == "__main__":
    if sys.argv[1:2] == ["roundtrip"] and len(sys.argv) == 4:
        roundtrip(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["torch"] and len(sys.argv) == 3:
        torch_step(sys.argv[2])
    elif sys.argv[1:2] == ["killed"] and len(sys.argv) == 3:
        killed(sys.argv[2])
    else:
        sys.exit(__doc__)
