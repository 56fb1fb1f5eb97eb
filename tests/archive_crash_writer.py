"""A writer for the archive crash test: appends turns until it is killed.

Run as a script, it is a small fork server (so that each kill does not pay for
a new interpreter): it imports the archive once, then reads one command per
line on stdin, `write <root> <seed>`, and for each forks a child that opens
the archive at ROOT and appends turns of 2-3 messages through
`Archive.append`.  The child prints `started <pid>` first, then, after each
append returns, `ack <id> <id> ...` (the acknowledged record ids, flushed);
it stops by itself after MAX_TURNS turns.  The server waits for the child to
end (the test kills it), prints `ended <pid> <wait status>`, and reads the next
command; it exits at end of input.  Every line is written with one os.write,
so lines of the server and its child never interleave.
"""

from __future__ import annotations

import os
import random
import sys
import traceback

from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage

MAX_TURNS = 200              # a child's loop is bounded even if nobody kills it
THREADS = (Thread("cli", "crash-a"), Thread("cli", "crash-b"))
# Line shapes that exercise the org escapes and the percent body encoding.
LINES = ["plain words about the archive and its turns", "* looks like a heading",
         ":END:", "#+TITLE: not a header", "ansi \x1b[32mgreen\x1b[0m and a bell \x07",
         "a date [2020-02-30 Sun] and 50% of it", "emoji 🙂 and é", "\tindented, tab kept"]


def say(line: str) -> None:
    """Write one line to stdout in a single write (atomic on a pipe)."""
    os.write(1, (line + "\n").encode("utf-8"))


def bodies(rng: random.Random, count: int = 8) -> list[str]:
    """COUNT message bodies of 16-64 KB, in lines of about 2 KB that begin with LINES."""
    out = []
    for _ in range(count):
        size = rng.randint(16_000, 64_000)
        lines, total = [], 0
        while total < size:
            line = rng.choice(LINES) + " filler" * rng.randint(200, 400)
            lines.append(line)
            total += len(line) + 1
        out.append("\n".join(lines))
    return out


def write_turns(root: str, seed: int) -> None:
    """Append turns to THREADS under ROOT, printing each append's ids once it returned."""
    rng = random.Random(seed)
    pool = bodies(rng)
    with Archive(root) as archive:
        for turn in range(MAX_TURNS):
            thread = THREADS[turn % len(THREADS)]
            roles = ["user", "assistant"] + (["assistant"] if rng.random() < 0.5 else [])
            turn_messages = [NewMessage(role=role, text=rng.choice(pool), thread=thread)
                             for role in roles]
            records = archive.append(turn_messages)
            say("ack " + " ".join(record.id for record in records))


def serve() -> None:
    """Fork one writer per `write <root> <seed>` line; report how each one ended."""
    for command in sys.stdin:
        _, root, seed = command.split()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                say(f"started {os.getpid()}")
                write_turns(root, int(seed))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        say(f"ended {pid} {status}")


if __name__ == "__main__":
    serve()
