#!/usr/bin/python3
"""Where ps-lite and FleetPS spend their CPU per operation, side by side.

    build/bin/ps_bench --shape=small8 --servers=2 --workers=2 --ops=push \\
        --pslite_bin=build/bin/pslite_driver --perf_dir=prof
    python3 bench/ps_profile.py prof [--top 12]

ps_bench --perf_dir samples every CPU with perf record (cpu-clock, once per
100 us of CPU) while ps-lite's and FleetPS's timed rounds run, one file per
case, op and system, and notes beside it which processes are the client
side (FleetPS: ps_bench itself, whose threads are the workers; ps-lite: its
worker processes) and which the servers, and how many ops ran. This prints,
per case and op, the CPU microseconds per op of each side, split by thread
(ZeroMQ's I/O threads or the program's own) and by kind of code (the
kernel: system calls, TCP, wake-ups; ZeroMQ; the table; the MAC; ...), for
ps-lite, FleetPS and FleetPS with auth (the case's auth run, when there is
one). With --top N also the N hottest functions of each system.

Samples of a kernel running in a VM gather where interrupts are enabled
again, so kernel time is one kind here, not split by function.
"""
import argparse
import collections
import os
import re
import subprocess
import sys

# (kind, test on (dso, symbol)), first match wins.
KINDS = [
    ("kernel", lambda dso, sym: dso == "[kernel.kallsyms]"),
    ("ZeroMQ", lambda dso, sym: "libzmq" in dso),
    ("MAC (libcrypto)", lambda dso, sym: "libcrypto" in dso),
    ("allocator", lambda dso, sym: "tcmalloc" in dso or re.match(
        r"(__libc_)?(malloc|free|calloc|realloc|cfree)$|_int_(malloc|free)|malloc_consolidate|"
        r"tcache|operator (new|delete)|tc_", sym) is not None),
    ("memcpy, memset", lambda dso, sym: re.match(r"__(memmove|memcpy|memset)|mem(cpy|move|set)$", sym) is not None),
    ("protobuf", lambda dso, sym: "libprotobuf" in dso or "google::protobuf" in sym or "fleet::pb::" in sym),
    # FleetPS's table (the optimizer rules, the finite check, its index);
    # ps-lite's driver's table (bench/pslite_driver.cc: Table, over an
    # unordered_map) and the KVServer request handle it runs in.
    ("table", lambda dso, sym: re.search(
        r"fleet::ps::(LocalShard|SparseTable|\w*Rule|\w*Accessor|KeySharder|ChunkedColumn|"
        r"KeyedRowColumn|\(anonymous namespace\)::(CheckFinite|Slot))|AllFinite|FirstNonFinite|"
        r"raw_hash_set<.*Slot|(^|::)Table::|_Hashtable|KVServer", sym) is not None),
    ("libc, other", lambda dso, sym: "libc.so" in dso or "libstdc++" in dso),
    ("program, other", lambda dso, sym: True),
]
KIND_NAMES = [k for k, _ in KINDS]
SAMPLE = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+(?P<period>\d+)\s+"
                    r"[0-9a-f]+\s+(?P<sym>.*?)\s+\((?P<dso>[^()]*)\)\s*$")


def kind_of(dso, sym):
    for name, test in KINDS:
        if test(dso, sym):
            return name
    return KIND_NAMES[-1]


def read_roles(path):
    info = {"roles": {}}
    with open(path) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition(" ")
            if key in ("client", "server"):
                info["roles"][int(value)] = key
            else:
                info[key] = value
    for key in ("ops", "period_us", "servers", "workers"):
        if key not in info:
            sys.exit(f"{path}: no '{key}' line (not written by ps_bench --perf_dir?)")
    return info


def profile(data_path, info):
    """CPU us per op by (side, thread kind, code kind), and by function."""
    ops = int(info["ops"])
    if ops <= 0:
        sys.exit(f"{data_path}: no ops counted")
    out = subprocess.run(["perf", "script", "-i", data_path, "-F", "comm,pid,tid,period,ip,sym,dso"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"perf script -i {data_path} failed: {out.stderr.strip()}")
    by_group = collections.Counter()
    by_function = collections.Counter()
    unparsed = 0
    for line in out.stdout.splitlines():
        m = SAMPLE.match(line)
        if not m:
            unparsed += 1
            continue
        side = info["roles"].get(int(m["pid"]))
        if side is None:
            continue  # another process (perf, the bench's coordinator, the rest of the machine)
        us = int(m["period"]) / 1000.0 / ops
        thread = "ZeroMQ I/O" if m["comm"].startswith("ZMQbg") else "program"
        sym = m["sym"] if m["sym"] != "[unknown]" else f"[{os.path.basename(m['dso'])}]"
        by_group[(side, thread, kind_of(m["dso"], m["sym"]))] += us
        by_function[(side, sym)] += us
    if unparsed > len(out.stdout.splitlines()) // 100:
        print(f"warning: {unparsed} lines of perf script output not understood", file=sys.stderr)
    return by_group, by_function


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("perf_dir", help="the folder given to ps_bench --perf_dir")
    parser.add_argument("--top", type=int, default=0, help="also the N hottest functions of each system")
    args = parser.parse_args()

    if not os.path.isdir(args.perf_dir):
        sys.exit(f"{args.perf_dir}: no such folder (give the folder of ps_bench --perf_dir)")
    runs = {}  # (case without " auth", servers, workers, op) -> {column: (info, profile)}
    for name in sorted(os.listdir(args.perf_dir)):
        if not name.endswith(".txt"):
            continue
        base = os.path.join(args.perf_dir, name[:-4])
        if not os.path.exists(base + ".data"):
            continue
        info = read_roles(base + ".txt")
        auth = info["case"].endswith(" auth")
        case = info["case"][:-len(" auth")] if auth else info["case"]
        if info["system"] == "pslite":
            column = "ps-lite"
            if auth and "ps-lite" in runs.get((case, info["servers"], info["workers"], info["op"]), {}):
                continue  # the plain case's ps-lite run is the same program
        else:
            column = "FleetPS auth" if auth else "FleetPS"
        key = (case, info["servers"], info["workers"], info["op"])
        runs.setdefault(key, {})[column] = (info, profile(base + ".data", info))
    if not runs:
        sys.exit(f"{args.perf_dir}: no ps_bench --perf_dir files")

    order = ["ps-lite", "FleetPS", "FleetPS auth"]
    for (case, servers, workers, op), systems in sorted(runs.items()):
        columns = [c for c in order if c in systems]
        ops = ", ".join(f"{c} {systems[c][0]['ops']}" for c in columns)
        print(f"== {case} {servers}x{workers} {op}: CPU us per op (perf samples over the timed rounds; ops: {ops})")
        def line(side, thread, code, values, fmt="14.1f"):
            print(f"  {side:<7} {thread:<11} {code:<16}" + "".join(f"{v:{fmt}}" for v in values))

        line("side", "threads", "code", columns, fmt=">14")
        for side in ("client", "server"):
            for thread in ("ZeroMQ I/O", "program"):
                for kind in KIND_NAMES:
                    values = [systems[c][1][0].get((side, thread, kind), 0.0) for c in columns]
                    if max(values) >= 0.05:
                        line(side, thread, kind, values)
        for side in ("client", "server"):
            line(side, "all", "all",
                 [sum(v for (s, _, _), v in systems[c][1][0].items() if s == side) for c in columns])
        line("both", "all", "all", [sum(systems[c][1][0].values()) for c in columns])
        print("  by code, both sides:")
        for kind in KIND_NAMES:
            values = [sum(v for (_, _, k), v in systems[c][1][0].items() if k == kind) for c in columns]
            if max(values) >= 0.05:
                line("", "", kind, values)
        if args.top > 0:
            for c in columns:
                print(f"  hottest functions, {c} (side, us per op):")
                for (side, sym), us in systems[c][1][1].most_common(args.top):
                    print(f"    {us:8.2f}  {side:<6} {sym[:110]}")
        print()


if __name__ == "__main__":
    main()
