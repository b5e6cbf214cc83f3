#!/usr/bin/python3
"""fleetrun's job page in a real browser (Debian's chromium, headless).

Usage: job_page_browser_test.py BUILD_DIR [SCREENSHOT.png]

Runs a small PS simulation (1 server, 2 workers) with fleetrun, waits until
/job/state holds a curve of at least two points, then loads /job in chromium
(--dump-dom after the page's script ran) and checks that the page shows the
job's processes and an SVG curve with at least two points. With a second
argument it also saves a screenshot there (the README's). Exit 0 when it
passed, 1 otherwise.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

# Each wait names what it waits for.
JOB_START_TIMEOUT_S = 60
CURVE_TIMEOUT_S = 60
BROWSER_TIMEOUT_S = 60


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def wait_for(what, timeout_s, probe):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.3)
    fail(f"no {what} within {timeout_s} s")


def chromium(args, timeout_s):
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--virtual-time-budget=3000"] + args
    return subprocess.run(cmd, capture_output=True, timeout=timeout_s, text=True)


def main():
    build = pathlib.Path(sys.argv[1]).resolve()
    screenshot = sys.argv[2] if len(sys.argv) > 2 else None
    source = pathlib.Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="job_page_") as tmp:
        work = pathlib.Path(tmp)
        subprocess.run([str(build / "bin/gen_ctr_data"), f"--out_dir={work}/ctr",
                        "--lines_per_file=1500"], check=True, capture_output=True)
        out = open(work / "fleetrun.out", "w+")
        job = subprocess.Popen(
            [str(build / "bin/fleetrun"), "--server_num=1", "--worker_num=2", "--http_port=0",
             f"--log_dir={work}/log", f"--config={source}/configs/ctr_dnn.yaml",
             "-o", f"data.train={work}/ctr/train", "-o", f"data.test={work}/ctr/test",
             "-o", f"data.oracle={work}/ctr/oracle.txt", "-o", "train.epochs=40",
             "-o", "train.log_interval=5"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            def page_url():
                m = re.search(r"job page (http://\S+/job)", (work / "fleetrun.out").read_text())
                return m.group(1) if m else None
            url = wait_for("'job page http://...' line from fleetrun", JOB_START_TIMEOUT_S, page_url)

            def curve():
                with urllib.request.urlopen(url + "/state", timeout=5) as r:
                    state = json.load(r)
                for s in state["series"].values():
                    if any(k not in ("t", "step") and len([v for v in vs if v is not None]) >= 2
                           for k, vs in s.items()):
                        return state
                return None
            state = wait_for("curve of two points in /job/state", CURVE_TIMEOUT_S, curve)
            names = sorted(p["name"] for p in state["processes"])
            if names != ["server 0", "worker 0", "worker 1"]:
                fail(f"/job/state lists {names}")

            dom = chromium(["--dump-dom", url], BROWSER_TIMEOUT_S)
            if dom.returncode != 0:
                fail(f"chromium --dump-dom exit {dom.returncode}: {dom.stderr[-2000:]}")
            rows = re.findall(r'<tr class="process" data-name="([^"]+)"', dom.stdout)
            if sorted(rows) != names:
                fail(f"the page shows processes {rows}, /job/state {names}:\n{dom.stdout[:3000]}")
            curves = re.findall(r'<polyline [^>]*points="([^"]*)"', dom.stdout)
            if not any(len(c.split()) >= 2 for c in curves):
                fail(f"no curve of two points on the page: {curves}")
            print(f"page shows {rows}; {len(curves)} curves, longest "
                  f"{max(len(c.split()) for c in curves)} points")
            if screenshot:
                shot = chromium(["--window-size=1100,760", f"--screenshot={screenshot}", url],
                                BROWSER_TIMEOUT_S)
                if shot.returncode != 0:
                    fail(f"chromium --screenshot: {shot.stderr[-2000:]}")
        finally:
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
