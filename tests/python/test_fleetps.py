"""fleetps_test: the fleetps module in real jobs started by fleetrun (CTest
runs it with /usr/bin/python3; tests/python/CMakeLists.txt sets the paths).

Exits 77 (CTest: skipped) with the reason when the module was not built
because python3-dev or pybind11-dev is missing.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

BIN_DIR = os.environ["FLEET_BIN_DIR"]
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "tables.yaml")
JOB = os.path.join(HERE, "fleetps_job.py")


def fleetrun(log_dir, *program, flags=(), timeout=120):
    """Runs a 2-server 2-worker job whose workers run `program`."""
    cmd = [os.path.join(BIN_DIR, "fleetrun"), "--server_num=2", "--worker_num=2",
           "--config=" + CONFIG, "--log_dir=" + log_dir, *flags, *program]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def worker_log(log_dir, rank):
    with open(os.path.join(log_dir, f"workerlog.{rank}")) as f:
        return f.read()


class FleetrunJobTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="fleetps_test.")
        self.log_dir = os.path.join(self.tmp.name, "log")
        self.out_dir = os.path.join(self.tmp.name, "out")
        os.mkdir(self.out_dir)

    def tearDown(self):
        self.tmp.cleanup()

    def test_round_trips_match_the_cpp_client(self):
        reference = os.path.join(os.environ["FLEET_TEST_DIR"], "fleetps_reference_client")
        run = fleetrun(self.log_dir, sys.executable, JOB, "roundtrip", self.out_dir, reference,
                       flags=["-o", "server.save_dir=" + os.path.join(self.out_dir, "ckpt")])
        self.assertEqual(run.returncode, 0,
                         f"{run.stderr}\nworker 0:\n{worker_log(self.log_dir, 0)}"
                         f"\nworker 1:\n{worker_log(self.log_dir, 1)}")
        self.assertTrue(os.path.exists(os.path.join(self.out_dir, "checked")), run.stderr)
        # Worker 0's progress reached fleetrun (the C++ worker reports none).
        self.assertRegex(run.stdout + run.stderr, r"throughput [1-9]\d* samples/s")
        self.assertIn("worker 0: step 1/1", worker_log(self.log_dir, 0))

    def test_torch_modules_train_as_local_ones_in_each_mode(self):
        try:
            import torch  # noqa: F401
        except ImportError as e:
            self.skipTest(f"python3-torch is not installed ({e}; scripts/setup.sh installs it)")
        for mode in ("sync", "async", "geo"):
            with self.subTest(mode=mode):
                log_dir, out_dir = self.log_dir + "_" + mode, os.path.join(self.out_dir, mode)
                os.mkdir(out_dir)
                run = fleetrun(log_dir, sys.executable, JOB, "torch", out_dir,
                               flags=["-o", "Distributed.mode=" + mode])
                self.assertEqual(run.returncode, 0,
                                 f"{run.stderr}\nworker 0:\n{worker_log(log_dir, 0)}"
                                 f"\nworker 1:\n{worker_log(log_dir, 1)}")
                self.assertTrue(os.path.exists(os.path.join(out_dir, "checked")), run.stderr)

    def test_a_killed_worker_fails_the_job_and_barrier_releases_the_gil(self):
        run = fleetrun(self.log_dir, sys.executable, JOB, "killed", self.out_dir)
        self.assertNotEqual(run.returncode, 0, run.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.out_dir, "ran_during_barrier")),
                        run.stderr)
        self.assertRegex(run.stderr, r"worker 1 \(pid \d+\) was killed by signal 9")


class SecretTest(unittest.TestCase):
    def test_init_refuses_to_start_without_the_jobs_secret(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        code = ("import fleetps\n"
                "try:\n"
                f"    fleetps.init(servers='127.0.0.1:1', config={CONFIG!r})\n"
                "except fleetps.InvalidArgument as e:\n"
                "    print(e)\n"
                "else:\n"
                "    print('joined')\n")
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertRegex(run.stdout, re.compile("secret", re.IGNORECASE))
        self.assertIn("FLEET_JOB_SECRET", run.stdout)


if __name__ == "__main__":
    try:
        import fleetps  # noqa: F401
    except ImportError as e:
        if os.environ.get("FLEET_PYTHON_MODULE") == "ON":
            raise
        print(f"skipped: the fleetps module was not built ({e}); install python3-dev and "
              "pybind11-dev (scripts/setup.sh) and configure again")
        sys.exit(77)
    unittest.main()
