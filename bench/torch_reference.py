#!/usr/bin/python3
"""Eager PyTorch on train_bench's two dense models, as an outside reference.

    /usr/bin/python3 bench/torch_reference.py [--seconds 3]

Needs Debian's python3-torch (not installed by setup.sh, and not part of CI:
it is a reference for bench/README.md, not a test). Prints samples/s for
  * the MNIST MLP step: 784-128-128-10 tanh, softmax cross-entropy, Adam
    (lr 1e-3), batch 64, on a fixed batch (train_bench's "bare step");
  * the ctr_dnn step of configs/ctr_dnn.yaml: 26 slots x 101 ids (100 plus
    "missing") of dim 9, sum-pooled, concatenated with 13 dense features,
    FC 247-400-400-400-1 ReLU, sigmoid cross-entropy, Adagrad (lr 0.15) on
    the embedding rows (sparse gradients) and Adam (lr 0.002) on the tower,
    batch 256 (train_bench's "compute only" step, whose pull and push go to
    local memory),
at 1 and 2 torch threads. Run train_bench in the same sitting to compare.

    /usr/bin/python3 bench/torch_reference.py --ctr_data DIR [--epochs 3] [--threads 1]

trains the same ctr_dnn model on gen_ctr_data's files instead (DIR/train,
DIR/test: Criteo text, read as data/ctr_reader.h reads them: log(1 + x) for
x > 0 else 0, one embedding row per (slot, value), "missing" a value of its
own), in file order, batch 256, and prints the training samples/s and the
held-out AUC: the single-process reference of the README's 2 x 4 simulation
(issue 24). The files are parsed into tensors before the clock starts, so
the figure is PyTorch's compute alone.
"""
import argparse
import ctypes
import glob
import gzip
import math
import os
import re
import sys
import time

# glibc hands PyTorch's freed multi-MiB buffers back to the system after
# every step, and faulting them in again (zeroed) costs eager PyTorch 3-4x
# here (perf: ~25% in page faults and memset, measured 2026-11-27). The
# reference is PyTorch at its best, so its allocator keeps them: the
# process starts again with these set, unless the caller set them.
MALLOC_KEEP = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "1073741824",
               "MALLOC_TOP_PAD_": "268435456"}
if any(key not in os.environ for key in MALLOC_KEEP):
    os.execve(sys.executable, [sys.executable] + sys.argv, {**MALLOC_KEEP, **os.environ})

import torch  # noqa: E402 (after the allocator's settings)
from torch import nn  # noqa: E402


def set_threads(threads):
    """torch's intra-op threads and OpenBLAS's own: Debian's torch calls OpenBLAS
    (BLAS_INFO=generic) without passing torch.set_num_threads on, so a "1 thread"
    run otherwise multiplies its matrices on every core."""
    torch.set_num_threads(threads)
    try:
        ctypes.CDLL("libopenblas.so.0").openblas_set_num_threads(threads)
    except (OSError, AttributeError):
        pass  # not OpenBLAS: torch's setting is the one that counts


def time_steps(step, seconds):
    for _ in range(20):
        step()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return len(times) / sum(times), times[len(times) // 2]


def mlp_step_fn():
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(64, 784, generator=gen)
    y = torch.randint(0, 10, (64,), generator=gen)
    model = nn.Sequential(nn.Linear(784, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(),
                          nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        opt.step()

    return step, 64


SLOTS, IDS, DIM, DENSE, BATCH = 26, 101, 9, 13, 256


class CtrDnn(nn.Module):
    def __init__(self, rows=SLOTS * IDS):
        super().__init__()
        self.embedding = nn.EmbeddingBag(rows, DIM, mode="sum", sparse=True)
        nn.init.uniform_(self.embedding.weight, -0.01, 0.01)
        layers, width = [], SLOTS * DIM + DENSE
        for hidden in (400, 400, 400):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.tower = nn.Sequential(*layers)

    def forward(self, ids, offsets, dense):
        pooled = self.embedding(ids, offsets).view(-1, SLOTS * DIM)
        return self.tower(torch.cat([pooled, dense], dim=1)).squeeze(1)


def ctr_step_fn():
    gen = torch.Generator().manual_seed(2)
    # One id per slot and sample, as the generated data has (Zipf over 100).
    ranks = torch.arange(1, 101, dtype=torch.float64)
    zipf = (1.0 / ranks**1.1)
    ids = torch.multinomial(zipf / zipf.sum(), BATCH * SLOTS, replacement=True, generator=gen)
    ids = ids.view(BATCH, SLOTS) + torch.arange(SLOTS) * IDS
    ids = ids.reshape(-1)
    offsets = torch.arange(BATCH * SLOTS)  # one bag per (sample, slot)
    dense = torch.log1p(torch.rand(BATCH, DENSE, generator=gen) * 20)
    labels = (torch.rand(BATCH, generator=gen) < 0.25).float()
    model = CtrDnn()
    sparse_opt = torch.optim.Adagrad(model.embedding.parameters(), lr=0.15,
                                     initial_accumulator_value=0.1)
    dense_opt = torch.optim.Adam(model.tower.parameters(), lr=0.002)
    loss_fn = nn.BCEWithLogitsLoss()

    def step():
        sparse_opt.zero_grad(set_to_none=False)
        dense_opt.zero_grad(set_to_none=False)
        loss_fn(model(ids, offsets, dense), labels).backward()
        sparse_opt.step()
        dense_opt.step()

    return step, BATCH


def read_ctr_files(folder, rows):
    """Criteo text lines of every part-* file in `folder` as (ids, dense, labels) tensors;
    `rows` maps (slot, value) to an embedding row and grows as values appear."""
    ids, dense, labels = [], [], []
    for path in sorted(glob.glob(os.path.join(folder, "part-*"))):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            for line in f:
                fields = line.rstrip("\r\n").split("\t")
                if len(fields) != 1 + DENSE + SLOTS:
                    continue
                labels.append(float(fields[0]))
                dense.append([math.log1p(int(x)) if x and int(x) > 0 else 0.0
                              for x in fields[1:1 + DENSE]])
                sample = []
                for slot, value in enumerate(fields[1 + DENSE:]):
                    key = (slot, int(value, 16) if value else -1)
                    sample.append(rows.setdefault(key, len(rows)))
                ids.append(sample)
    return (torch.tensor(ids, dtype=torch.int64), torch.tensor(dense, dtype=torch.float32),
            torch.tensor(labels, dtype=torch.float32))


def auc(scores, labels):
    """Area under the ROC curve (ties counted half), as data/metrics.h computes it."""
    order = torch.argsort(scores)
    s, y = scores[order], labels[order]
    _, inverse, counts = torch.unique_consecutive(s, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mid_rank = (ends - (counts.double() - 1) / 2)[inverse]  # 1-based mean rank of each tie
    positives = y.sum().item()
    negatives = len(y) - positives
    return ((mid_rank[y > 0.5].sum().item() - positives * (positives + 1) / 2) /
            (positives * negatives))


def train_on_ctr_files(folder, epochs, threads):
    set_threads(threads)
    torch.manual_seed(1)
    rows = {}
    train = read_ctr_files(os.path.join(folder, "train"), rows)
    test = read_ctr_files(os.path.join(folder, "test"), rows)
    model = CtrDnn(len(rows))
    sparse_opt = torch.optim.Adagrad(model.embedding.parameters(), lr=0.15,
                                     initial_accumulator_value=0.1)
    dense_opt = torch.optim.Adam(model.tower.parameters(), lr=0.002)
    loss_fn = nn.BCEWithLogitsLoss()
    n = len(train[2])
    samples, start = 0, time.perf_counter()
    for _ in range(epochs):
        for begin in range(0, n, BATCH):
            ids, dense, labels = (t[begin:begin + BATCH] for t in train)
            sparse_opt.zero_grad(set_to_none=False)
            dense_opt.zero_grad(set_to_none=False)
            offsets = torch.arange(ids.numel())  # one bag per (sample, slot)
            loss_fn(model(ids.reshape(-1), offsets, dense), labels).backward()
            sparse_opt.step()
            dense_opt.step()
            samples += len(labels)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        ids, dense, labels = test
        scores = model(ids.reshape(-1), torch.arange(ids.numel()), dense)
    print(f"ctr_dnn on {folder}: {n} train samples x {epochs} epochs, {threads} thread(s): "
          f"{samples / seconds:.0f} train samples/s, held-out AUC {auc(scores, labels):.4f} "
          f"({len(labels)} samples, {len(rows)} embedding rows)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--ctr_data", help="train ctr_dnn on gen_ctr_data's files in this folder")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    print(f"torch {torch.__version__} (BLAS_INFO={blas.group(1) if blas else '?'}, "
          f"oneDNN {torch.backends.mkldnn.is_available()})")
    if args.ctr_data:
        train_on_ctr_files(args.ctr_data, args.epochs, args.threads)
        return
    for name, make in (("MNIST MLP step, batch 64", mlp_step_fn),
                       ("ctr_dnn step, batch 256", ctr_step_fn)):
        for threads in (1, 2):
            set_threads(threads)
            step, batch = make()
            rate, p50 = time_steps(step, args.seconds)
            print(f"{name}, {threads} thread(s): {rate * batch:9.0f} samples/s over all steps, "
                  f"{batch / p50:9.0f} at p50 ({p50 * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
