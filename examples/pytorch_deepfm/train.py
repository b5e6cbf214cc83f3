"""A PyTorch DeepFM whose embeddings live on FleetPS's parameter servers, run
as each worker of a fleetrun job (examples/pytorch_deepfm/README.md):

  fleetrun --server_num=2 --worker_num=2 --config=examples/pytorch_deepfm/deepfm.yaml \
      /usr/bin/python3 examples/pytorch_deepfm/train.py --data=data/ctr

Every worker trains on its share of each global batch (worker r takes lines
r, r + W, ... of data/train) through fleetps.torch.EmbeddingBag (rows on the
servers, table 0) and its MLP's parameters in dense table 1
(fleetps.torch.DenseParameters), in the job's mode. Worker 0 then evaluates
on data/test and, as the reference, trains the same model with a local
torch.nn.EmbeddingBag and torch's Adagrad and Adam (the servers' rules and
settings) on the same global batches, from the same initial rows and MLP,
for the same epochs. It prints both AUCs, the oracle AUC of the data, and
the samples/s of both.
"""

import argparse
import glob
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import fleetps
import fleetps.torch

FIELDS, DENSE_FEATURES = 26, 13
SPARSE_TABLE, DENSE_TABLE = 0, 1


# ---- Data: Criteo format (label, 13 integers, 26 hex ids; any may be empty)

def _fmix64(k):
    with np.errstate(over="ignore"):
        k ^= k >> np.uint64(33)
        k *= np.uint64(0xFF51AFD7ED558CCD)
        k ^= k >> np.uint64(33)
        k *= np.uint64(0xC4CEB9FE1A85EC53)
        k ^= k >> np.uint64(33)
    return k


def _keys(ids):
    """uint64 keys of ids [n, FIELDS] (the hex values; missing = 2**64 - 1):
    a mix of (slot, id), so keys spread over the servers' shards."""
    slots = np.arange(FIELDS, dtype=np.uint64)
    with np.errstate(over="ignore"):
        seeds = _fmix64(np.uint64(0x9E3779B97F4A7C15) * (slots + np.uint64(1)))
    return _fmix64(ids ^ seeds)


def read_criteo(folder):
    """labels float32 [n], dense float32 [n, 13] (log1p of positive values),
    keys uint64 [n, 26] of every part-* file of `folder`, in name order."""
    labels, dense, ids = [], [], []
    files = sorted(glob.glob(os.path.join(folder, "part-*")))
    if not files:
        sys.exit(f"train.py: no part-* files in {folder} (build/bin/gen_ctr_data --out_dir=...)")
    for path in files:
        with open(path) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                labels.append(float(fields[0]))
                dense.append([float(x) if x else 0.0 for x in fields[1:1 + DENSE_FEATURES]])
                ids.append([int(x, 16) if x else (1 << 64) - 1
                            for x in fields[1 + DENSE_FEATURES:]])
    dense = np.log1p(np.maximum(np.array(dense, np.float64), 0)).astype(np.float32)
    return (np.array(labels, np.float32), dense, _keys(np.array(ids, np.uint64)))


def auc(labels, scores):
    """Area under the ROC curve (Mann-Whitney, ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # Average ranks of tied scores.
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = (s + e + 1) / 2
    positives = labels > 0.5
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return (ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


# ---- The model

class DeepFM(nn.Module):
    """logit = sum of the fields' first-order weights + FM's pairwise term
    over their embeddings + an MLP over the embeddings and dense features.
    `embedding` maps ids [n, 1] to rows [n, 1 + dim] (an EmbeddingBag of
    one id per bag): a fleetps.torch.EmbeddingBag or a local one."""

    def __init__(self, embedding, dim, hidden):
        super().__init__()
        self.embedding = embedding
        self.dim = dim
        layers, width = [], FIELDS * dim + DENSE_FEATURES
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, ids, dense):
        n = ids.shape[0]
        rows = self.embedding(ids.reshape(-1, 1)).view(n, FIELDS, 1 + self.dim)
        first_order = rows[:, :, 0].sum(1)
        v = rows[:, :, 1:]
        pairwise = 0.5 * (v.sum(1) ** 2 - (v ** 2).sum(1)).sum(1)
        deep = self.mlp(torch.cat([v.reshape(n, -1), dense], 1)).squeeze(1)
        return first_order + pairwise + deep


def batches(n, batch):
    for start in range(0, n - batch + 1, batch):
        yield slice(start, start + batch)


def evaluate(model, ids, dense, labels, batch=4096):
    model.eval()
    scores = []
    with torch.no_grad():
        for s in batches(len(labels) + batch - 1, batch):
            s = slice(s.start, min(s.stop, len(labels)))
            scores.append(torch.sigmoid(model(ids[s], dense[s])).numpy())
    model.train()
    return auc(labels, np.concatenate(scores))


# ---- Training

def train_on_servers(job, args, train, hidden, dim):
    """This worker's share of every global batch through the servers;
    returns the model and the samples/s of the whole job."""
    labels, dense, keys = train
    workers, rank = job.world_size, job.rank
    # Every worker makes the same number of steps (sync mode needs it).
    steps = len(labels) // (args.batch_size * workers)
    mine = np.arange(steps * args.batch_size * workers)[rank::workers]
    torch.manual_seed(args.seed)
    model = DeepFM(fleetps.torch.EmbeddingBag(job, SPARSE_TABLE, mode="sum"), dim, hidden)
    dense_params = fleetps.torch.DenseParameters(job, DENSE_TABLE, model.mlp.parameters())
    dense_params.initialize()  # worker 0's MLP for every worker
    ids_t = fleetps.torch.keys_tensor(keys[mine])
    dense_t, labels_t = torch.from_numpy(dense[mine]), torch.from_numpy(labels[mine])
    job.barrier("start")
    start = time.monotonic()
    slices = list(batches(len(mine), args.batch_size))
    # Progress lines in the worker's log, and fleetrun's metrics and throughput.
    progress = job.progress(total_steps=args.epochs * len(slices), steps_per_epoch=len(slices),
                            samples_per_step=args.batch_size)
    progress.step(0)
    for epoch in range(args.epochs):
        for i, s in enumerate(slices):
            loss = F.binary_cross_entropy_with_logits(model(ids_t[s], dense_t[s]), labels_t[s])
            model.mlp.zero_grad()
            loss.backward()  # pushes the rows' gradients
            # Async mode: the next batch's rows come while the MLP steps.
            model.embedding.prefetch(ids_t[slices[(i + 1) % len(slices)]].reshape(-1, 1))
            dense_params.step(args.batch_size)
            progress.step(epoch * len(slices) + i + 1)
        print(f"worker {rank}: epoch {epoch} done, last loss {loss.item():.4f}", flush=True)
    model.embedding.flush()
    dense_params.flush()
    job.barrier("trained")
    return model, len(mine) * workers * args.epochs / (time.monotonic() - start)


def train_locally(job, args, train, vocab, initial_rows, hidden, dim):
    """The reference: the same model with a local nn.EmbeddingBag over the
    keys `vocab`, starting from the servers' initial rows and the same MLP,
    trained with torch's Adagrad and Adam set as the servers' tables on the
    same global batches."""
    labels, dense, keys = train
    global_batch = args.batch_size * job.world_size
    steps = len(labels) // global_batch
    emb = nn.EmbeddingBag(len(vocab), 1 + dim, mode="sum", sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(initial_rows))
    torch.manual_seed(args.seed)
    model = DeepFM(emb, dim, hidden)
    sparse_cfg, dense_cfg = job.table(SPARSE_TABLE), job.table(DENSE_TABLE)
    sparse_opt = torch.optim.Adagrad(emb.parameters(), lr=sparse_cfg["learning_rate"],
                                     initial_accumulator_value=sparse_cfg["initial_g2sum"],
                                     eps=sparse_cfg["epsilon"])
    dense_opt = torch.optim.Adam(model.mlp.parameters(), lr=dense_cfg["learning_rate"],
                                 betas=(dense_cfg["beta1"], dense_cfg["beta2"]),
                                 eps=dense_cfg["epsilon"])
    index = lambda k: torch.from_numpy(np.searchsorted(vocab, k).astype(np.int64))
    n = steps * global_batch
    ids_t, dense_t, labels_t = index(keys[:n]), torch.from_numpy(dense[:n]), torch.from_numpy(
        labels[:n])
    start = time.monotonic()
    for _ in range(args.epochs):
        for s in batches(n, global_batch):
            loss = F.binary_cross_entropy_with_logits(model(ids_t[s], dense_t[s]), labels_t[s])
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
    return model, index, n * args.epochs / (time.monotonic() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/ctr", help="gen_ctr_data's folder")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=256, help="samples per worker per step")
    p.add_argument("--hidden", default="64,32", help="the MLP's layer widths")
    p.add_argument("--seed", type=int, default=1, help="the MLP's initialisation")
    p.add_argument("--no_reference", action="store_true", help="skip the local reference")
    args = p.parse_args()
    hidden = [int(h) for h in args.hidden.split(",")]
    torch.set_num_threads(1)  # the workers and servers share the machine's cores

    job = fleetps.init()
    dim = job.table(SPARSE_TABLE)["pull_dim"] - 1
    train = read_criteo(os.path.join(args.data, "train"))
    if job.rank == 0:
        test_labels, test_dense, test_keys = read_criteo(os.path.join(args.data, "test"))
        test_dense = torch.from_numpy(test_dense)
        # The reference's start: every key's row before any push (training
        # waits for worker 0 at its first barrier).
        vocab = np.unique(np.concatenate([train[2].reshape(-1), test_keys.reshape(-1)]))
        initial_rows = None if args.no_reference else job.pull_sparse(SPARSE_TABLE, vocab)
    model, ps_rate = train_on_servers(job, args, train, hidden, dim)
    if job.rank != 0:
        return
    ps_auc = evaluate(model, fleetps.torch.keys_tensor(test_keys), test_dense, test_labels)
    oracle = float(dict(line.split() for line in open(os.path.join(args.data, "oracle.txt"))
                        if not line.startswith("#"))["oracle_auc"])
    print(f"fleetps ({job.mode}, {job.world_size} workers, {job.num_servers} servers): "
          f"AUC {ps_auc:.4f}, oracle {oracle:.4f} (gap {oracle - ps_auc:.4f}), "
          f"{ps_rate:.0f} samples/s", flush=True)
    if args.no_reference:
        return
    local, index, local_rate = train_locally(job, args, train, vocab, initial_rows, hidden, dim)
    local_auc = evaluate(local, index(test_keys), test_dense, test_labels)
    print(f"local nn.EmbeddingBag reference: AUC {local_auc:.4f} "
          f"(fleetps - local {ps_auc - local_auc:+.4f}), {local_rate:.0f} samples/s", flush=True)


if __name__ == "__main__":
    main()
