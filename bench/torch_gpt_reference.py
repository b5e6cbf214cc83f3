#!/usr/bin/python3
"""Eager PyTorch on gpt_bench's GPU step, as the outside reference of issue #21.

    python3 bench/torch_gpt_reference.py [--preset 124m|345m|1.3b] [--recompute]
                                         [--seconds 10] [--device cuda:0] [--profile]

The same model as GptModel: GPT-2 (pre-LayerNorm blocks, GELU tanh, biases,
the head tied to the token embedding), vocabulary 50304, T 1024 positions;
the same step as gpt_bench --device=cuda:K: zero grads, forward and
cross-entropy under bf16 autocast, backward, global-norm clipping at 1.0,
fused AdamW (lr 1e-4, betas 0.9 / 0.95, weight decay 0.1), on one fixed
random batch; attention through scaled_dot_product_attention (causal).
Presets and batches as gpt_bench's GPU presets. --recompute checkpoints
each block. Prints tokens/s at the p50 step, the peak memory PyTorch
allocated and, as gpt_bench counts it, the device memory in use.
--profile then runs 3 more steps under torch.profiler and prints the GPU
time per step by kernel kind, in gpt_bench's kinds, so that each kind has
its PyTorch figure beside FleetPS's. Not part of CI (needs torch and a
GPU); scripts/gpu_check.sh runs it when `python3 -c 'import torch'` works.
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

PRESETS = {  # layers, channels, heads, batch
    "124m": (12, 768, 12, 16),
    "345m": (24, 1024, 16, 8),
    "1.3b": (24, 2048, 16, 4),
}
VOCAB, SEQ = 50304, 1024


class Block(nn.Module):
    def __init__(self, channels, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.ln2 = nn.LayerNorm(channels)
        self.fc = nn.Linear(channels, 4 * channels)
        self.fc_proj = nn.Linear(4 * channels, channels)

    def forward(self, x):
        batch, seq, channels = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(channels, dim=2)
        shape = (batch, seq, self.heads, channels // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, channels))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, channels, heads, recompute):
        super().__init__()
        self.recompute = recompute
        self.wte = nn.Embedding(VOCAB, channels)
        self.wpe = nn.Embedding(SEQ, channels)
        self.blocks = nn.ModuleList(Block(channels, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(channels)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.recompute else block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="124m", choices=sorted(PRESETS))
    parser.add_argument("--recompute", action="store_true")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    layers, channels, heads, batch = PRESETS[args.preset]
    device = torch.device(args.device)
    torch.manual_seed(42)
    model = Gpt(layers, channels, heads, args.recompute).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                  weight_decay=0.1, fused=True)
    stream = torch.randint(0, VOCAB, (batch * SEQ + 1,), device=device)
    tokens = stream[:-1].view(batch, SEQ)
    targets = stream[1:].view(batch, SEQ)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        torch.cuda.synchronize(device)

    for _ in range(3):
        step()
    torch.cuda.reset_peak_memory_stats(device)
    times = []
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end or len(times) < 5:
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    times.sort()
    p50 = times[len(times) // 2]
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(device)}: GPT {args.preset} "
          f"B {batch} x T {SEQ}, bf16 autocast, recompute {'on' if args.recompute else 'off'}: "
          f"{batch * SEQ / p50:.0f} tokens/s at p50 ({p50 * 1e3:.1f} ms, {len(times)} steps), "
          f"peak allocated {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB")
    # gpt_bench's figure is the device's total minus free (context and
    # library workspaces included): the same reading here, with the caching
    # allocator still holding what it reserved at the peak.
    free, total = torch.cuda.mem_get_info(device)
    print(f"device memory in use {(total - free) / 2**20:.0f} MiB (PyTorch reserved at peak "
          f"{torch.cuda.max_memory_reserved(device) / 2**20:.0f} MiB)")
    if args.profile:
        print_time_by_kind(step)


# gpt_bench's kinds, matched on CUDA kernel names (first match wins).
KINDS = [("attention", ("flash", "fmha", "attention", "sdpa")),
         ("matmul", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")),
         ("layernorm", ("layer_norm",)),
         ("gelu", ("gelu",)),
         ("cross-entropy", ("softmax", "nll", "cross_entropy")),
         ("embedding", ("embedding", "index")),
         ("optimizer", ("adam", "multi_tensor")),
         ("norm/clip", ("norm", "foreach"))]


def print_time_by_kind(step, steps=3):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
    by_kind, names = {}, {}
    for event in prof.key_averages():
        # Self time: a kernel's own; an operator's is 0 on the device, so
        # nothing is counted twice.
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = event.self_cuda_time_total
        if us <= 0:
            continue
        name = event.key.lower()
        kind = next((k for k, marks in KINDS if any(m in name for m in marks)), "other")
        by_kind[kind] = by_kind.get(kind, 0.0) + us / 1e3 / steps
        names.setdefault(kind, []).append((us / 1e3 / steps, event.key[:70]))
    total = sum(by_kind.values())
    print(f"GPU time by kind, ms per step (torch.profiler, {steps} steps): total {total:.1f}")
    for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        top = ", ".join(f"{n} {t:.2f}" for t, n in sorted(names[kind], reverse=True)[:3])
        print(f"    {kind:14s} {ms:7.2f}  ({top})")


if __name__ == "__main__":
    main()
