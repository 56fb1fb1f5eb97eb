"""`opencortex memory`: search, reindex, forget and import (argument handling and printing only)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opencortex.clireport import EXIT_FAILED, EXIT_OK, print_json
from opencortex.config import Config, load_config
from opencortex.events import Thread
from opencortex.homeaccess import home_problem, require_writable_home, sole_writer
from opencortex.untrusted import visible

if TYPE_CHECKING:
    from opencortex.memory.importer import ImportReport
    from opencortex.memory import Archive


def run_memory_command(args: argparse.Namespace) -> int:
    config = load_config(args.home)
    if args.memory_command == "reindex":
        require_writable_home(config.home, "reindexing")
        with sole_writer(config), _archive(config) as archive:
            count = archive.reindex()
        print(f"reindexed {count} messages from {config.memory_dir}")
        return EXIT_OK
    if args.memory_command == "forget":
        return _forget(config, args)
    if args.memory_command == "import":
        return _import(config, args)
    thread = Thread.parse(args.thread) if args.thread else None
    problem = home_problem(config.home)
    warnings = [] if problem is None else [
        f"cannot write to {config.home} ({problem}); searching the org files directly "
        "(slower, nothing is saved)"]
    with _archive(config, read_only=problem is not None) as archive:
        hits = _unique_hits(archive.search(args.query, thread=thread, limit=2 * args.limit))
    return _print_hits(hits[:args.limit], warnings, args.json)


def _archive(config: Config, **options: Any) -> Archive:
    """The home's archive, its index made with the configured stemmer ([memory] stemmer)."""
    from opencortex.memory import Archive
    return Archive(config.memory_dir, tokenizer=config.memory.tokenizer, **options)


def _forget(config: Config, args: argparse.Namespace) -> int:
    """`memory forget`: count, confirm (--yes or y/N on the terminal), remove."""
    from opencortex.memory.retention import count_forgettable, forget, parse_before
    thread = Thread.parse(args.thread)
    before = parse_before(args.before) if args.before else None
    require_writable_home(config.home, "forgetting")
    with sole_writer(config), _archive(config) as archive:
        count = count_forgettable(archive, thread, before)
        if count == 0:
            print(f"no messages of {thread} to forget")
            return EXIT_OK
        if not args.yes:
            try:
                answer = input(f"Forget {count} messages of {thread} for good? [y/N] ")
            except EOFError:            # nobody to ask: no
                answer = ""
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing was forgotten")
                return EXIT_FAILED
        removed = forget(archive, thread, before)
    print(f"forgot {removed} messages of {thread}")
    return EXIT_OK


def import_history(archive: Archive, path: Path, **options: Any) -> ImportReport:
    """Import the file at PATH into ARCHIVE (OPTIONS as `import_file` takes them), then
    end each thread it filled with a checkpoint, so a start resumes it from its tail."""
    from opencortex.conversation.conversations import checkpoint_threads
    from opencortex.memory.importer import import_file
    report = import_file(archive, path, **options)
    if report.added:
        checkpoint_threads(archive, [Thread.parse(name) for name in report.threads])
    return report


def _import(config: Config, args: argparse.Namespace) -> int:
    """`memory import FILE`: import as the home's only writer, then say what happened."""
    thread = Thread.parse(args.thread) if args.thread else None
    require_writable_home(config.home, "importing")
    with sole_writer(config), _archive(config) as archive:
        report = import_history(archive, args.file, fmt=args.format, thread=thread,
                                assistants=args.assistant, partition=_owner_function(config))
    complete = not report.problems and report.stopped is None
    if args.json:
        print_json({"status": "ok" if complete else "incomplete", "file": str(args.file),
                    **report.as_dict()})
    else:
        _print_import(report, args.file)
    return EXIT_OK if complete else EXIT_FAILED


def _owner_function(config: Config) -> Callable[[Thread], str]:
    """Each thread's owner as the kernel's recall names it (`owner_of`), so an import
    files messages under the owners a start will use."""
    from opencortex.conversation.recall import owner_of
    owners = dict(config.conversation.owners)
    return lambda thread: owner_of(thread, owners)


def _print_import(report: ImportReport, path: Path) -> None:
    """What `memory import` did, in words: results on stdout, problems on stderr; the
    file's thread ids and the problems quoting it shown with controls made visible."""
    threads = sorted(report.threads.items(), key=lambda pair: -pair[1])
    where = ", ".join(f"{thread} ({count})" for thread, count in threads[:5])
    more = f" and {len(threads) - 5} more threads" if len(threads) > 5 else ""
    if report.added:
        _show(f"imported {report.added} messages from {path} ({report.format}) into "
              f"{where}{more}")
    if report.duplicates:
        _show(f"{report.duplicates} messages were already in memory; not added again"
              if report.added else f"nothing new: the {report.duplicates} messages of "
              f"{path} are already in memory")
    elif not report.added:
        _show(f"no messages imported from {path}")
    if report.ignored:
        _show(f"left out {report.ignored} service or empty messages")
    if report.older:
        _show(f"{report.older} imported messages are older than their thread's last "
              "message: its history lists them after it; search and recall use their dates")
    for problem in report.shown:
        _show(f"skipped {problem}", sys.stderr)
    if report.problems > len(report.shown):
        _show(f"… and {report.problems - len(report.shown)} more", sys.stderr)
    if report.problems:
        _show(f"skipped {report.problems} unreadable lines or messages; fix them and import "
              "again (what is already in memory is not added twice)", sys.stderr)
    if report.stopped:
        _show(f"opencortex: import stopped: {report.stopped}", sys.stderr)


def _show(line: str, stream: Any = None) -> None:
    """Print LINE (to STREAM, default stdout) with its control characters made visible."""
    print(visible(line), file=stream or sys.stdout)


def _unique_hits(hits: list[Any]) -> list[Any]:
    """Each message once: copies a /merge made are folded into their original."""
    from opencortex.conversation.branches import unique
    return unique(hits)


def _print_hits(hits: list[Any], warnings: list[str], as_json: bool) -> int:
    if as_json:
        print_json({"status": "ok", "hits": [hit.model_dump() for hit in hits],
                     "warnings": warnings})
        return EXIT_OK
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for hit in hits:            # archived text is anyone's: one line each, no controls
        snippet = " ".join(hit.snippet.split())
        print(visible(f"{hit.channel}:{hit.chat_id}  {hit.role:<9} {hit.id}  {snippet}"
                      .replace("\n", " ")))
    if not hits:
        print("no matches", file=sys.stderr)
    return EXIT_OK
