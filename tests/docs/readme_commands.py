#!/usr/bin/python3
"""The READMEs' commands, checked against the code they describe.

Usage: readme_commands.py SOURCE_DIR BUILD_DIR

Two checks over README.md and examples/*/README.md:

1. Every ```bash block: each program it names under build/bin/ exists in
   BUILD_DIR/bin, and each file it names under configs/, examples/ or
   scripts/ exists in SOURCE_DIR (cheap; catches a renamed program, config or
   script).
2. Every ```bash block marked runnable, by the line before its fence:

       <!-- runnable -->
       <!-- runnable: FLAGS_lines_per_file=2000 FLAGS_max_steps=20 -->

   runs as written with bash -e -o pipefail, in order, in a fresh folder that
   looks like a clone after the README's first command (the source tree's
   files, build/ pointing at BUILD_DIR, small CTR data in data/ctr) and, when
   this process may, in a network namespace of its own (the READMEs' fixed
   ports never clash with anything else on the machine). The variables after
   "runnable:" shrink a long block to small data: FLAGS_<flag> sets a flag of
   every FleetPS program (comm/program_help.h), so the block's text stays the
   README's. A block that exits non-zero or runs past its time fails the test,
   which prints the block and its output.

Exit status: 0 when everything passed, 1 otherwise.
"""

import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

# Per runnable block; a block that takes longer belongs shrunk or unmarked.
BLOCK_TIMEOUT_S = 90
# The CTR data every CTR block reads, as the README's first command leaves
# it, but small: 4 train files and 1 test file of this many lines.
CTR_LINES_PER_FILE = 2000

FENCE = re.compile(r"(?:^<!-- runnable(?::([^>]*))? -->\n)?^```bash\n(.*?)^```", re.M | re.S)
PROGRAM = re.compile(r"(?<![\w/.-])build/bin/([\w-]+)")
SOURCE_FILE = re.compile(r"(?<![\w/.-])((?:configs|examples|scripts)/[\w./-]+\.(?:yaml|sh|json))")


def readmes(source):
    yield source / "README.md"
    yield from sorted(source.glob("examples/*/README.md"))


def blocks(source):
    """(readme, line, env or None when not runnable, text) of each bash block."""
    for readme in readmes(source):
        text = readme.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start(2))
            runnable = m.group(0).startswith("<!-- runnable")
            env = dict(kv.split("=", 1) for kv in shlex.split(m.group(1) or "")) if runnable else None
            yield readme.relative_to(source), line, env, m.group(2)


def check_names(source, build, all_blocks):
    failures = []
    for readme, line, _, text in all_blocks:
        for program in PROGRAM.findall(text):
            if not os.access(build / "bin" / program, os.X_OK):
                failures.append(f"{readme}:{line}: build/bin/{program} is not a program of this build")
        for path in SOURCE_FILE.findall(text):
            if not (source / path).exists():
                failures.append(f"{readme}:{line}: {path} does not exist")
    return failures


def tracked_entries(source, folder=""):
    """The names in `folder` of the source tree that git tracks (not what a
    developer's runs left there: logs, data, outputs)."""
    listed = subprocess.run(["git", "-C", str(source / folder), "ls-files", "--", "."],
                            capture_output=True, text=True, check=True).stdout.split()
    return sorted({path.split("/")[0] for path in listed})


def fresh_clone(source, build, work):
    """`work` as a clone after the README's first command: the source tree's
    tracked files (links), build/ -> BUILD_DIR, small data/ctr."""
    for name in tracked_entries(source):
        if name != "data":
            (work / name).symlink_to(source / name)
    (work / "build").symlink_to(build)
    # data/ holds code next to the folders the commands generate there.
    (work / "data").mkdir()
    for name in tracked_entries(source, "data"):
        (work / "data" / name).symlink_to(source / "data" / name)
    subprocess.run([str(build / "bin" / "gen_ctr_data"), "--out_dir=data/ctr",
                    f"--lines_per_file={CTR_LINES_PER_FILE}"],
                   cwd=work, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def own_network_namespace():
    """The prefix that runs a command in a new network namespace with its
    loopback up, or [] when this process may not make one."""
    probe = ["unshare", "--net", "--", "ip", "link", "set", "lo", "up"]
    try:
        if subprocess.run(probe, capture_output=True, timeout=10).returncode == 0:
            return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return []


def run_block(work, prefix, index, env, text):
    script = work / f".readme_block_{index}.sh"
    script.write_text(text)
    full_env = dict(os.environ, **env)
    started = time.monotonic()
    proc = subprocess.Popen(prefix + ["bash", "-e", "-o", "pipefail", str(script)], cwd=work,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        rc = f"killed after {BLOCK_TIMEOUT_S} s"
    finally:
        # What the block left running in the background.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return rc, time.monotonic() - started, output.decode(errors="replace")


def main():
    source, build = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
    all_blocks = list(blocks(source))
    failures = check_names(source, build, all_blocks)
    runnable = [b for b in all_blocks if b[2] is not None]
    print(f"{len(all_blocks)} bash blocks, {len(runnable)} runnable")
    with tempfile.TemporaryDirectory(prefix="readme_commands_") as tmp:
        work = pathlib.Path(tmp)
        fresh_clone(source, build, work)
        prefix = own_network_namespace()
        if not prefix:
            print("note: no network namespace of our own (not root?): blocks use this machine's ports")
        for index, (readme, line, env, text) in enumerate(runnable):
            rc, seconds, output = run_block(work, prefix, index, env, text)
            print(f"{readme}:{line}: exit {rc} in {seconds:.1f} s")
            if rc != 0:
                failures.append(f"{readme}:{line}: exit {rc}; the block:\n{text}output:\n{output[-6000:]}")
    for f in failures:
        print("FAILED " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
