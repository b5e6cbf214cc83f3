#!/usr/bin/python3
"""One training step's GPU time by kernel, from Nsight Compute's CSV.

    python3 bench/ncu_step_summary.py ncu_step.csv

The CSV is what `ncu --csv --metrics gpu__time_duration.sum
--profile-from-start off gpt_bench ...` prints for gpt_bench's profiled
step (scripts/gpu_check.sh with GPU_CHECK_NCU=1 writes it). Prints the
step's total, the time by kind (gpt_bench's kinds, from kernel names; the
16-bit rounding passes of the GEMM operands apart from the GEMMs) and the
kernels that took the most, each with its launch count. Kernels under ncu
run one at a time, so the total is the sum of kernel times, without the
gaps or overlap of a normal step.
"""
import csv
import sys
from collections import defaultdict

UNITS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3,
         "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}

# (kind, name fragments), first match wins; matched on the lower-cased name.
KINDS = [("attention", ("flash", "attention")),
         ("gemm rounding", ("roundrows",)),
         ("matmul", ("gemm", "nvjet", "cutlass", "sm90_", "sm80_", "cublas", "splitk")),
         ("layernorm", ("layernorm",)),
         ("gelu", ("gelu",)),
         ("xentropy", ("crossentropy",)),
         ("bias grads", ("columnpartials", "addbias")),
         ("embedding", ("encoder",)),
         ("optimizer", ("adamw", "sumofsquares")),
         ("dropout", ("dropout",))]


def short_name(name):
    """The kernel's name without its namespace, template arguments and
    parameters: fleet::...::FlashForwardMma<__nv_bfloat16, 64>(...) ->
    FlashForwardMma<__nv_bfloat16, 64>, keeping the template arguments,
    which tell the instantiations apart."""
    for anonymous in ("(anonymous namespace)::", "<unnamed>::"):
        name = name.replace(anonymous, "")
    if name.startswith("void "):
        name = name[5:]
    name = name.split("(")[0]
    head, sep, tail = name.partition("<")
    return head.split("::")[-1] + sep + tail


def main(path):
    per_kernel = defaultdict(float)
    launches = defaultdict(int)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("Metric Name") != "gpu__time_duration.sum":
                continue
            ms = float(row["Metric Value"].replace(",", "")) * UNITS[row["Metric Unit"]]
            name = short_name(row["Kernel Name"])
            per_kernel[name] += ms
            launches[name] += 1
    if not per_kernel:
        print(f"{path}: no gpu__time_duration.sum rows")
        return 1
    by_kind = defaultdict(float)
    for name, ms in per_kernel.items():
        lower = name.lower()
        kind = next((k for k, marks in KINDS if any(m in lower for m in marks)), "other")
        by_kind[kind] += ms
    total = sum(per_kernel.values())
    print(f"ncu, one 124M step: {sum(launches.values())} kernels, {total:.2f} ms of kernel time")
    for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"    {kind:14s} {ms:8.2f} ms  {100 * ms / total:5.1f}%")
    print("  kernels taking the most:")
    for name, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:25]:
        print(f"    {ms:8.2f} ms  x{launches[name]:<4d} {name[:110]}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
