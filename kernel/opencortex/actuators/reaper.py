"""Runs one approved command and leaves nothing of it running (a script, run by path).

The shell actuator starts this file as
`python -I -S reaper.py --parent KERNEL_PID -- argv...` in a new session, with
an empty environment, the command's working directory, stdin a pipe carrying
the command's environment (NUL-separated NAME=VALUE, then end of file), stdout
the pipe the kernel reads the command's output from, and stderr a second pipe
for the one-line report below.  The reaper never writes to stdout.

What it does:
- becomes a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): every process the
  command leaves behind, even one that called `setsid` or double-forked, is
  re-parented to the reaper instead of init, so it can still be found;
- asks for SIGTERM when the kernel dies (`PR_SET_PDEATHSIG`), so a dead kernel
  leaves no command behind either;
- spawns the command in a new session (stdin /dev/null, stderr joined to
  stdout) and lets go of the output pipe itself;
- when the command exits, or when the reaper gets SIGTERM, SIGINT or SIGHUP
  (the kernel's timeout), kills the command's process group, then scans /proc
  for its own descendants and SIGKILLs them, again and again, for at most
  SWEEP_SECONDS, reaping as it goes;
- writes its report on stderr and exits.

The report is one line, `KIND NUMBER SWEEP`: `exited STATUS`, `signaled SIGNAL`,
`stopped 0` (asked to stop before the command ended) or `failed ERRNO` (the
command could not be started), then `clean` when no descendant is left, or
`unswept` when that cannot be known.  The exit status mirrors it for people
(STATUS, 128+SIGNAL, 143 when stopped, 127 when the command could not start);
the kernel reads the report.

Elsewhere than Linux (no subreaper, no /proc) this degrades to killing the
command's process group: a process that left the group escapes, the report says
`unswept`, and the kernel still ends the turn at its deadline.  A command that
kills the reaper itself escapes too; only a cgroup would contain that.

Only the standard library, and little of it: this starts for every command.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WATCHED = {signal.SIGCHLD, *STOP_SIGNALS}
SWEEP_SECONDS = 0.5
SWEEP_ROUND_WAIT = 0.01
ENVIRONMENT_LIMIT = 1 << 20
FAILED_TO_START, STOPPED = 127, 128 + signal.SIGTERM


class Usage(Exception):
    """The reaper was started with arguments it does not understand."""


def parse_arguments(arguments: list[str]) -> tuple[int, list[str]]:
    """The kernel's pid and the command's argv from `--parent PID -- argv...`."""
    if len(arguments) < 4 or arguments[0] != "--parent" or arguments[2] != "--":
        raise Usage("usage: reaper.py --parent PID -- COMMAND [ARGUMENT...]")
    return int(arguments[1]), arguments[3:]


def prctl(option: int, value: int) -> bool:
    """Linux prctl(OPTION, VALUE); False where it is missing or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def read_environment() -> dict[bytes, bytes]:
    """The command's environment, read from stdin until end of file."""
    chunks, size = [], 0
    while size <= ENVIRONMENT_LIMIT:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    environment = {}
    for entry in b"".join(chunks).split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if name and equals:
            environment[name] = value
    return environment


def redirect(fd: int, path: str, flags: int) -> None:
    """Point FD at PATH opened with FLAGS."""
    opened = os.open(path, flags)
    os.dup2(opened, fd)
    os.close(opened)


def spawn(argv: list[str]) -> int:
    """Start ARGV (searched on the PATH of os.environ) in a new session; its pid."""
    options = dict(file_actions=[(os.POSIX_SPAWN_DUP2, 1, 2)], setsigmask=(),
                   setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    try:
        return os.posix_spawnp(argv[0], argv, os.environ, setsid=True, **options)
    except NotImplementedError:  # no POSIX_SPAWN_SETSID: a new process group is the next best
        return os.posix_spawnp(argv[0], argv, os.environ, setpgroup=0, **options)


def reap(statuses: dict[int, int]) -> None:
    """Collect every child that has ended, recording its wait status in STATUSES."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = status


def wait_for_command(command: int, statuses: dict[int, int]) -> bool:
    """Wait until COMMAND ends (True) or the reaper is asked to stop (False)."""
    while command not in statuses:
        if signal.sigwait(WATCHED) != signal.SIGCHLD:
            return False
        reap(statuses)
    return True


def parent_of(pid: str) -> int | None:
    """The parent pid of process PID from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root: int) -> list[int]:
    """Every live or zombie process below ROOT, from one scan of /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = parent_of(entry)
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    found, pending = [], list(children.get(root, ()))
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


def kill(pid: int, group: bool = False) -> None:
    """SIGKILL PID (its process group if GROUP); gone or forbidden is fine."""
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def sweep(command: int, statuses: dict[int, int], subreaper: bool) -> bool:
    """Kill COMMAND's group and every descendant; True when none is left.

    The group is killed by number only while the command is unreaped (its pid
    cannot be reused then) or when there is no /proc sweep to find its members.
    """
    can_scan = subreaper and os.path.isdir("/proc/self")
    if command not in statuses or not can_scan:
        kill(command, group=True)
    if not can_scan:
        if command not in statuses:
            statuses[command] = os.waitpid(command, 0)[1]
        return False
    give_up = time.monotonic() + SWEEP_SECONDS
    while True:
        reap(statuses)
        left = descendants(os.getpid())
        if not left:
            return True
        if time.monotonic() > give_up:
            return False
        for pid in left:
            kill(pid)
        signal.sigtimedwait({signal.SIGCHLD}, SWEEP_ROUND_WAIT)


def outcome(status: int | None) -> tuple[str, int]:
    """The report's KIND NUMBER and the exit status for a wait STATUS (None: stopped)."""
    if status is None:
        return "stopped 0", STOPPED
    if os.WIFSIGNALED(status):
        return f"signaled {os.WTERMSIG(status)}", 128 + os.WTERMSIG(status)
    return f"exited {os.waitstatus_to_exitcode(status)}", os.waitstatus_to_exitcode(status)


def report(line: str) -> None:
    """Write the report LINE on stderr; a kernel that stopped listening is fine."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass


def run(parent: int, argv: list[str]) -> int:
    """Run ARGV for the kernel PARENT and clear up after it; the exit status."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent:
        return STOPPED  # the kernel died before the reaper could ask to hear of it
    environment = read_environment()
    redirect(0, os.devnull, os.O_RDONLY)
    os.environ.clear()
    os.environ.update({os.fsdecode(k): os.fsdecode(v) for k, v in environment.items()})
    try:
        command = spawn(argv)
    except OSError as error:
        report(f"failed {error.errno or 0} clean")
        return FAILED_TO_START
    finally:
        redirect(1, os.devnull, os.O_WRONLY)
    statuses: dict[int, int] = {}
    ended = wait_for_command(command, statuses)
    clean = sweep(command, statuses, subreaper)
    kind, code = outcome(statuses.get(command) if ended else None)
    report(f"{kind} {'clean' if clean else 'unswept'}")
    return code


def main() -> int:
    """Entry point: parse the arguments and run the command."""
    try:
        parent, argv = parse_arguments(sys.argv[1:])
    except (Usage, ValueError) as error:
        report(f"usage {error}")
        return 2
    return run(parent, argv)


if __name__ == "__main__":
    sys.exit(main())
