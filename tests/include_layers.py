#!/usr/bin/python3
"""Checks that every #include of the project runs down the house's floors.

ARCHITECTURE.md's layout, bottom to top: comm/; ps/, trainer/ and data/;
collective/ and worker/; the programs' libraries (heter/, serve/, launch/,
tools/, python/: the fleetps module); examples/, whose thin main()s stand
on them (gpt_serve's engine is serve/). A file may include its own folder and any floor below its own,
never a floor above or a neighbour on its own floor. Inside trainer/ the
rooms stack the same way: the root (tensor, backend interface, arena, the
types kernels share) below kernels/, then layers/, then models/. trainer/
and data/ are single-process: from comm/ they take only the base headers
(fleet_base), never a transport. Benches and tests include no test header
of another test folder except the shared helpers named below.

Usage: include_layers.py SOURCE_DIR   (exit 1 and one line per violation)
"""
import os
import re
import sys

FLOORS = {
    "comm": 0,
    "ps": 1, "trainer": 1, "data": 1,
    "collective": 2, "worker": 2,
    "heter": 3, "serve": 3, "launch": 3, "tools": 3, "python": 3,
    "examples": 4,
}
# Rooms inside trainer/, bottom to top.
TRAINER_ROOMS = {"": 0, "kernels": 1, "layers": 2, "models": 3}
# What single-process code may take from comm/: the fleet_base headers.
COMM_BASE = {"comm/status.h", "comm/thread_pool.h", "comm/splitmix.h",
             "comm/collective.h", "comm/file_io.h", "comm/file_system.h",
             "comm/checksum.h", "comm/byte_io.h", "comm/vector_clones.h"}
SINGLE_PROCESS = {"trainer", "data"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def top(path):
    return path.split("/", 1)[0]


def trainer_room(path):
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else ""


def violations(src):
    out = []
    for folder in list(FLOORS) + ["bench", "tests"]:
        root = os.path.join(src, folder)
        for dirpath, _, files in os.walk(root):
            for name in files:
                if not name.endswith((".h", ".cc", ".cu")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), src)
                if path.startswith("tests/fuzz/corpus"):
                    continue
                with open(os.path.join(src, path), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for inc in INCLUDE.findall(text):
                    if "/" not in inc or top(inc) not in FLOORS and top(inc) not in ("tests", "bench"):
                        continue  # same-folder relative or generated (.pb.h) includes
                    why = check(path, inc)
                    if why:
                        out.append(f"{path}: includes {inc}: {why}")
    return out


def check(path, inc):
    me, it = top(path), top(inc)
    if me in ("tests", "bench"):
        if it == "tests" and me == "bench":
            return "a benchmark includes a test header"
        return None
    if it in ("tests", "bench"):
        return "production code includes a test or bench header"
    if it == me:
        if me == "trainer":
            for room in (trainer_room(path), trainer_room(inc)):
                if room not in TRAINER_ROOMS:
                    return f"trainer/{room}/ is not one of trainer's rooms ({', '.join(r or '(root)' for r in TRAINER_ROOMS)})"
            if TRAINER_ROOMS[trainer_room(inc)] > TRAINER_ROOMS[trainer_room(path)]:
                return (f"trainer/{trainer_room(path) or '(root)'} is below "
                        f"trainer/{trainer_room(inc)}")
        return None
    if FLOORS[it] >= FLOORS[me]:
        return f"{it}/ is not below {me}/"
    if me in SINGLE_PROCESS and it == "comm" and inc.rsplit(".", 1)[0] + ".h" not in COMM_BASE:
        return f"{me}/ is single-process: from comm/ only {', '.join(sorted(COMM_BASE))}"
    return None


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "."
    bad = violations(src)
    for line in bad:
        print(line)
    print(f"{len(bad)} upward include(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
