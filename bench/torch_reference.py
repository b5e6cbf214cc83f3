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
"""
import argparse
import re
import time

import torch
from torch import nn


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
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(SLOTS * IDS, DIM, mode="sum", sparse=True)
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    print(f"torch {torch.__version__} (BLAS_INFO={blas.group(1) if blas else '?'}, "
          f"oneDNN {torch.backends.mkldnn.is_available()})")
    for name, make in (("MNIST MLP step, batch 64", mlp_step_fn),
                       ("ctr_dnn step, batch 256", ctr_step_fn)):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            step, batch = make()
            rate, p50 = time_steps(step, args.seconds)
            print(f"{name}, {threads} thread(s): {rate * batch:9.0f} samples/s over all steps, "
                  f"{batch / p50:9.0f} at p50 ({p50 * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
