"""The EPC port against hostile local clients (a script, not a test): prints figures.

    python bench/bench_epc_hostile.py
    python bench/bench_epc_hostile.py --quick   # smaller floods, a few seconds

It starts a real `opencortex serve` (echo backend) and measures, each case on a
fresh kernel:
- resident memory growth while 30 connections each announce a 16 MiB frame and
  send its body (target: a few MB);
- growth while one connection sends the length `-00001` and streams 300 MiB
  (target: a few MB, and the connection closed at once);
- kernel threads and open files with 600 idle unauthenticated connections, and
  how many of them are still open after the authentication deadline;
- another client's `status` round trip while an authenticated client sends
  calls with 0.5 MB replies and never reads (target: milliseconds; before: the
  loop stops, so no reply at all);
- warning lines on stderr for 2,000 wrong secrets (target: one or two).
Every wait is bounded; a case that hits its bound says so.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from epc.handler import encode_message
from sexpdata import Symbol

from figures import percentile


class KernelProcess:
    """`opencortex serve --backend echo` in a temporary home; stopped by `stop`."""

    def __init__(self, root: Path):
        home, runtime = root / "home", root / "run"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text("[emacs]\nauth_timeout = 2\n")
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "OPENCORTEX_HOME": str(home)}
        self.stderr = open(root / "stderr", "w+b")   # a file: a full pipe would stall it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "opencortex", "serve", "--home", str(home),
             "--backend", "echo"], stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self.port = int(self.process.stdout.readline())
        from opencortex.serve_port import default_connection_file
        written = default_connection_file(home, runtime / "opencortex")
        self.secret = json.loads(written.read_text())["secret"]
        time.sleep(0.5)                               # let its server thread start

    def status_field(self, name: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
        return -1

    def rss_mb(self) -> float:
        return self.status_field("VmRSS") / 1024

    def peak_mb(self) -> float:
        return self.status_field("VmHWM") / 1024

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def stop(self) -> str:
        """Stop the kernel; its stderr."""
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        self.stderr.seek(0)
        err = self.stderr.read().decode(errors="replace")
        self.stderr.close()
        return err


def call_frame(uid: int, method: str, *args) -> bytes:
    return encode_message("call", uid, Symbol(method), list(args))


def stream(port: int, head: bytes, body_bytes: int, seconds: float) -> int:
    """Send HEAD then up to BODY_BYTES, for at most SECONDS; bytes the kernel took."""
    sent, piece = 0, b"x" * (1 << 20)
    deadline = time.monotonic() + seconds
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(2)
        try:
            sock.sendall(head)
            while sent < body_bytes and time.monotonic() < deadline:
                sent += sock.send(piece[:body_bytes - sent])
        except OSError:
            pass
    return sent


def case_big_frames(kernel: KernelProcess, connections: int) -> None:
    before = kernel.rss_mb()
    threads = [threading.Thread(target=stream, args=(kernel.port, b"ffffff", 16 << 20, 30))
               for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    print(f"{connections} connections announcing 16 MiB frames: RSS {before:.0f} → "
          f"{kernel.rss_mb():.0f} MB (peak {kernel.peak_mb():.0f} MB)")


def case_negative_length(kernel: KernelProcess, megabytes: int) -> None:
    before = kernel.rss_mb()
    started = time.monotonic()
    taken = stream(kernel.port, b"-00001", megabytes << 20, 30)
    print(f"`-00001` then {megabytes} MiB: kernel took {taken >> 20} MiB in "
          f"{time.monotonic() - started:.1f} s; RSS {before:.0f} → {kernel.rss_mb():.0f} MB "
          f"(peak {kernel.peak_mb():.0f} MB)")


def case_idle(kernel: KernelProcess, count: int) -> None:
    before = (kernel.status_field("Threads"), kernel.open_files())
    sockets = []
    try:
        for _ in range(count):
            sockets.append(socket.create_connection(("127.0.0.1", kernel.port)))
        time.sleep(0.5)
        during = (kernel.status_field("Threads"), kernel.open_files())
        time.sleep(3)                                 # past the 2 s deadline of this kernel
        after = (kernel.status_field("Threads"), kernel.open_files())
    finally:
        for sock in sockets:
            sock.close()
    print(f"{count} idle connections: threads/open files {before[0]}/{before[1]} → "
          f"{during[0]}/{during[1]}, 3 s later {after[0]}/{after[1]}")


def authenticated(kernel: KernelProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", kernel.port))
    sock.sendall(call_frame(1, "authenticate", kernel.secret))
    sock.settimeout(10)
    sock.recv(4096)
    return sock


def round_trip(sock: socket.socket, uid: int, timeout: float) -> float:
    """Seconds for one `status` call, or TIMEOUT when no reply came in time."""
    started = time.monotonic()
    sock.settimeout(timeout)
    try:
        sock.sendall(call_frame(uid, "status", "main"))
        sock.recv(1 << 16)
    except OSError:
        return timeout
    return time.monotonic() - started


def case_never_reads(kernel: KernelProcess, calls: int) -> None:
    good = authenticated(kernel)
    hostile = socket.socket()
    hostile.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hostile.connect(("127.0.0.1", kernel.port))
    hostile.sendall(call_frame(1, "authenticate", kernel.secret))
    name = "m" * 500_000                 # "no such method: mmm…": a cheap, big reply

    def flood():
        try:
            for uid in range(2, calls + 2):
                hostile.sendall(call_frame(uid, name))
        except OSError:
            pass

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    trips: list[float] = []
    for uid in range(2, 42):                          # stop at the first call left unanswered
        trips.append(round_trip(good, uid, 10.0))
        if trips[-1] >= 10.0:
            break
        time.sleep(0.25)                              # spread over the flood, ~10 s
    flooder.join(60)
    hostile.close()
    good.close()
    print(f"`status` round trip while a client sends {calls} calls with 0.5 MB replies "
          "and reads nothing: "
          f"{len(trips)} calls, p50 {percentile(trips, .5) * 1000:.1f} ms, "
          f"max {max(trips) * 1000:.1f} ms "
          f"(10000 ms = no reply within 10 s)")


def case_wrong_secrets(kernel: KernelProcess, count: int) -> None:
    started = time.monotonic()
    for attempt in range(count):
        with socket.create_connection(("127.0.0.1", kernel.port)) as sock:
            sock.settimeout(5)
            try:
                sock.sendall(call_frame(1, "authenticate", f"wrong-{attempt}"))
                sock.recv(4096)
            except OSError:
                pass
    seconds = time.monotonic() - started
    lines = [line for line in kernel.stop().splitlines() if "secret" in line]
    print(f"{count} wrong secrets in {seconds:.1f} s: {len(lines)} log lines about them")


def fresh(case, *args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        kernel = KernelProcess(Path(tmp))
        try:
            case(kernel, *args)
        finally:
            if kernel.process.poll() is None:
                kernel.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller floods")
    quick = parser.parse_args().quick
    fresh(case_big_frames, 30)
    fresh(case_negative_length, 32 if quick else 300)
    fresh(case_idle, 100 if quick else 600)
    fresh(case_never_reads, 200)
    fresh(case_wrong_secrets, 200 if quick else 2000)


if __name__ == "__main__":
    main()
