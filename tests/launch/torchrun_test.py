#!/usr/bin/python3
"""Two mnist_mlp ranks started by torchrun itself (torch.distributed.run).

Usage: torchrun_test.py BUILD_DIR

torchrun's agent holds MASTER_PORT with its own store and says so in
TORCHELASTIC_USE_AGENT_STORE; rank 0 then hosts the job's KV store on
MASTER_PORT+1 (comm/cluster.h). Checks that both ranks train together,
each naming torchrun's variables in its start-up line. Exit 0 when it
passed, 1 when it failed, 77 (skipped) without torch.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile

TORCHRUN_TIMEOUT_S = 240

# Debian 12's torch 1.13 under Python 3.11: Std.from_str("0") (torchrun's
# default for -r/-t) gives None, and torchrun fails before starting anything.
LAUNCH = r"""
import sys
import torch.distributed.run as run
from torch.distributed.elastic.multiprocessing.api import Std
if Std.from_str("0") is None:
    parse = Std.from_str
    Std.from_str = staticmethod(lambda text: parse(text) or Std.NONE)
run.main(sys.argv[1:])
"""


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def two_free_ports():
    """A port p with p and p + 1 free now (MASTER_PORT and the job's store)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    fail("no two consecutive free ports on 127.0.0.1")


def main():
    if len(sys.argv) != 2:
        fail(__doc__)
    build = os.path.abspath(sys.argv[1])
    python = "/usr/bin/python3"
    if subprocess.run([python, "-c", "import torch.distributed.run"],
                      capture_output=True).returncode != 0:
        print("SKIPPED: torch is not importable by /usr/bin/python3 (scripts/setup.sh installs "
              "python3-torch)")
        sys.exit(77)
    port = two_free_ports()
    env = {
        "PATH": "/usr/bin:/bin",
        "FLEET_JOB_SECRET": os.urandom(32).hex(),
        "FLAGS_max_steps": "20",
        "OMP_NUM_THREADS": "1",
    }
    with tempfile.TemporaryDirectory(prefix="fleet_torchrun_") as work:
        try:
            run = subprocess.run(
                [python, "-c", LAUNCH, "--nproc_per_node=2", "--no_python",
                 "--master_addr=127.0.0.1", f"--master_port={port}",
                 os.path.join(build, "bin", "mnist_mlp"), "--epochs", "1"],
                cwd=work, env=env, capture_output=True, text=True,
                timeout=TORCHRUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            fail(f"torchrun's job did not end within {TORCHRUN_TIMEOUT_S} s")
    out = run.stdout + run.stderr
    if run.returncode != 0:
        fail(f"torchrun exit {run.returncode}:\n{out[-4000:]}")
    for rank in (0, 1):
        if not re.search(rf"collective {rank}/2 .*\(from torchrun's RANK={rank} WORLD_SIZE=2 ", out):
            fail(f"rank {rank}'s start-up line does not name torchrun's variables:\n{out[-4000:]}")
    hosted = (f"rank 0 hosts the job's KV store on 127.0.0.1:{port + 1} "
              "(torchrun's MASTER_ADDR:MASTER_PORT+1)")
    if hosted not in out:
        fail(f"no '{hosted}':\n{out[-4000:]}")
    if not re.search(r"as rank 1 of 2", out):
        fail(f"the ranks did not form one group of 2:\n{out[-4000:]}")
    print(f"PASSED: torchrun's 2 ranks trained together (agent store on {port}, the job's on "
          f"{port + 1})")


if __name__ == "__main__":
    main()
