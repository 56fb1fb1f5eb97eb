"""Kernel start-up: from exec of `opencortex serve` to its port line (a script, not a test).

    python bench/bench_startup.py            # 10 runs of each case
    python bench/bench_startup.py --quick    # 2 runs of each case
    python bench/bench_startup.py --tree /tmp/old   # the kernel of another checkout

Each run starts `python -m opencortex serve --backend echo` on a temporary home
and measures two moments from exec: the first stdout line (the port Emacs's
`epc:start-epc` waits for), and the first answered call (a python-epc client
connects as soon as the port is printed, authenticates with the secret of the
connection file, then calls `status`: when the kernel can really take work).
Cases, interleaved run by run so a busy machine slows them alike:
- cold: the home's skill compile cache empty (as on a first start);
- warm: the cache filled by an earlier start (every later start);
- uncached: OPENCORTEX_SKILL_CACHE=0, skills compiled on every start (the path
  before the cache existed).
Prints p50, min and max in seconds for each case and moment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import percentile

CASES = ("cold", "warm", "uncached")


def environment(home: Path, runtime: Path, case: str, tree: Path | None) -> dict[str, str]:
    """The kernel's environment for CASE (the kernel of TREE when given)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("OPENCORTEX_")}
    env.update(OPENCORTEX_HOME=str(home), XDG_RUNTIME_DIR=str(runtime))
    if case == "uncached":
        env["OPENCORTEX_SKILL_CACHE"] = "0"
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "kernel"), env.get("PYTHONPATH", "")])
    return env


def connection_secret(runtime: Path) -> str:
    """The secret in the one connection file under RUNTIME."""
    [written] = (runtime / "opencortex").glob("kernel-*.json")
    return json.loads(written.read_text())["secret"]


def first_call(port: int, runtime: Path) -> None:
    """Authenticate and call `status` as Emacs would first (waits for the answer)."""
    from epc.client import EPCClient
    client = EPCClient(("127.0.0.1", port))
    try:
        assert client.call_sync("authenticate", [connection_secret(runtime)], timeout=30) is True
        client.call_sync("status", ["bench"], timeout=30)
    finally:
        client.close()


def start_once(root: Path, case: str, tree: Path | None) -> tuple[float, float]:
    """Start and stop one kernel on ROOT/home; seconds to its port line and first answer."""
    home, runtime = root / "home", root / f"run-{case}"
    if case == "cold":
        shutil.rmtree(home / "cache", ignore_errors=True)
    with open(root / "stderr", "w+b") as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "opencortex", "serve", "--backend", "echo"],
            stdout=subprocess.PIPE, stderr=stderr, env=environment(home, runtime, case, tree))
        try:
            line = process.stdout.readline()
            port_line = time.perf_counter() - started
            if not line.strip().isdigit():
                process.wait(timeout=30)
                stderr.seek(0)
                raise SystemExit(f"{case}: no port line ({line!r}); "
                                 f"stderr: {stderr.read().decode()[-2000:]}")
            first_call(int(line), runtime)
            answered = time.perf_counter() - started
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()
    return port_line, answered


def report(name: str, values: list[float]) -> None:
    """Print p50, min and max of VALUES (seconds)."""
    print(f"  {name:<22} p50 {percentile(values, 0.5):.3f} s   min {min(values):.3f} s"
          f"   max {max(values):.3f} s   ({len(values)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 runs of each case")
    parser.add_argument("--runs", type=int, default=10, help="runs of each case (default 10)")
    parser.add_argument("--tree", type=Path, help="run the kernel of this checkout instead")
    arguments = parser.parse_args()
    runs = 2 if arguments.quick else arguments.runs
    tree = arguments.tree.resolve() if arguments.tree else None
    figures: dict[str, tuple[list[float], list[float]]] = {case: ([], []) for case in CASES}
    with tempfile.TemporaryDirectory(prefix="oc-startup-") as scratch:
        root = Path(scratch)
        (root / "home").mkdir()
        start_once(root, "warm", tree)                 # fills the cache, warms the OS caches
        for _ in range(runs):
            for case in CASES:
                port_line, answered = start_once(root, case, tree)
                figures[case][0].append(port_line)
                figures[case][1].append(answered)
    print(f"opencortex serve start-up ({tree or 'this checkout'}; "
          f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r})")
    for case in CASES:
        print(f"{case}:")
        report("exec -> port line", figures[case][0])
        report("exec -> first answer", figures[case][1])


if __name__ == "__main__":
    main()
