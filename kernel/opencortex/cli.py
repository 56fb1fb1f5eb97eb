"""The `opencortex` command: argument parsing and printing only."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

from opencortex import __version__
from opencortex.config import Config, ConfigError, load_config
from opencortex.events import EventError, Thread, chat_message

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _common(top: bool) -> argparse.ArgumentParser:
    """--home and -v, accepted before or after the command name."""
    common = argparse.ArgumentParser(add_help=False)
    unset = None if top else argparse.SUPPRESS
    common.add_argument("--home", type=Path, default=unset, help="state directory (default: "
                        "$OPENCORTEX_HOME or $XDG_DATA_HOME/opencortex)")
    common.add_argument("-v", "--verbose", action="store_true",
                        default=False if top else argparse.SUPPRESS, help="log progress to stderr")
    return common


def _backend_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["auto", "echo", "script", "anthropic", "openai"],
                        help="LLM backend (default: the configuration's `backend`)")
    parser.add_argument("--model", help="model for every turn, beating the [llm] model table")
    parser.add_argument("--script", type=Path, help="replies file for the script backend")


def _config_for(args: argparse.Namespace) -> Config:
    """The configuration with the command's --backend, --script and --model applied."""
    config = load_config(args.home, backend=args.backend, script=args.script)
    if args.script and not args.backend:
        config = config.model_copy(update={"backend": "script"})
    if args.model:
        config = config.model_copy(update={"llm": config.llm.model_copy(
            update={"model": args.model})})
    return config


def build_parser() -> argparse.ArgumentParser:
    common = _common(top=False)
    parser = argparse.ArgumentParser(prog="opencortex", parents=[_common(top=True)], description=(
        "Talk to LLM-driven Hy skills; every model reply is read as data, verified, then acted on."))
    parser.add_argument("--version", action="version", version=f"opencortex {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    chat = sub.add_parser("chat", parents=[common], help="chat in the terminal (or one message)")
    chat.add_argument("-m", "--message", help="send one message, print the reply, exit")
    chat.add_argument("--thread", default="cli:local",
                      help="thread as CHANNEL:CHAT-ID or a chat id on cli (default cli:local)")
    chat.add_argument("--json", action="store_true", help="print the turn as one JSON object")
    chat.add_argument("--session", metavar="NAME",
                      help="continue the saved session NAME (see /sessions) before chatting")
    _backend_options(chat)

    skills = sub.add_parser("skills", parents=[common], help="list the loaded skills")
    skills.add_argument("--json", action="store_true")
    skills.add_argument("--check", action="store_true",
                        help="exit non-zero and name file:line when a skill is broken")

    read = sub.add_parser("read-action", parents=[common],
                          help="dry run: how a model reply is read and judged")
    read.add_argument("file", nargs="?", default="-", help="reply text file, or - for stdin")
    read.add_argument("--channel", default="cli", help="channel the reply answers (default cli)")
    read.add_argument("--json", action="store_true")

    memory = sub.add_parser("memory", parents=[common], help="search or reindex the archive")
    memory_sub = memory.add_subparsers(dest="memory_command", metavar="ACTION", required=True)
    search = memory_sub.add_parser("search", parents=[common], help="full-text search")
    search.add_argument("query")
    search.add_argument("--thread", help="only this thread (CHANNEL:CHAT-ID)")
    search.add_argument("--limit", type=int, default=10)
    search.add_argument("--json", action="store_true")
    memory_sub.add_parser("reindex", parents=[common], help="rebuild the index from the org files")

    serve = sub.add_parser("serve", parents=[common],
                           help="run as an EPC server for Emacs (prints the port first)")
    serve.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free)")
    serve.add_argument("--connection-file", type=Path,
                       help="where to write port and secret (default: the runtime dir)")
    _backend_options(serve)

    sub.add_parser("doctor", parents=[common], help="what is present and missing, with fixes")
    return parser


def _print_json(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2))


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"opencortex: {message}", file=sys.stderr)
    return code


# -- commands -----------------------------------------------------------------

async def _chat_once(config: Config, args: argparse.Namespace, thread: Thread) -> int:
    from opencortex.runtime import build_kernel
    shown: list[str] = []
    kernel = build_kernel(config, writer=shown.append if args.json else None)
    try:
        if not args.json:
            for warning in _startup_warnings(kernel):
                print(f"warning: {warning}", file=sys.stderr)
        if args.session:
            await kernel.run_command(thread, f"/load {shlex.quote(args.session)}")
        event = chat_message(args.message, thread.channel, thread.chat_id)
        result = await kernel.handle(event)
    finally:
        await kernel.aclose()
    if args.json:
        _print_json(result.as_json())
    else:
        _print_unshown_errors(result)
    return EXIT_OK if result.status == "done" else EXIT_FAILED


def _print_unshown_errors(result: Any) -> None:
    """The terminal actuator already showed errors of a cli thread; others were not shown."""
    if result.thread.channel != "cli":
        for error in result.errors:
            print(f"error: {error}", file=sys.stderr)


def _startup_warnings(kernel: Any) -> list[str]:
    warnings = [str(error) for error in kernel.skills.errors]
    if kernel.backend.warning:
        warnings.append(kernel.backend.warning)
    return warnings


async def _chat_loop(config: Config, thread: Thread, session: str | None) -> int:
    from opencortex.runtime import build_kernel
    kernel = build_kernel(config)
    try:
        if session:
            print(await kernel.run_command(thread, f"/load {shlex.quote(session)}"),
                  file=sys.stderr)
        for warning in _startup_warnings(kernel):
            print(f"warning: {warning}", file=sys.stderr)
        print(f"opencortex {__version__} — thread {thread}, backend {kernel.backend.name}. "
              "/reload reloads skills, /quit or Ctrl-D leaves.", file=sys.stderr)
        while True:
            try:
                line = await asyncio.to_thread(input, "you> ")
            except (EOFError, KeyboardInterrupt):
                print(file=sys.stderr)
                return EXIT_OK
            if not line.strip():
                continue
            if line.strip() in ("/quit", "/exit"):
                return EXIT_OK
            if line.strip() == "/reload":
                errors = kernel.skills.reload()
                print(f"reloaded {len(kernel.skills.skills)} skills", file=sys.stderr)
                for error in errors:
                    print(f"warning: {error}", file=sys.stderr)
                continue
            result = await kernel.handle(chat_message(line, thread.channel, thread.chat_id))
            _print_unshown_errors(result)
    finally:
        await kernel.aclose()


def cmd_chat(args: argparse.Namespace) -> int:
    config = _config_for(args)
    thread = Thread.parse(args.thread)
    if args.message is not None:
        return asyncio.run(_chat_once(config, args, thread))
    return asyncio.run(_chat_loop(config, thread, args.session))


def cmd_skills(args: argparse.Namespace) -> int:
    from opencortex.runtime import load_skills
    registry = load_skills(load_config(args.home))
    rows = [{"name": s.name, "priority": s.priority, "description": s.description,
             "phases": [p for p in ("trigger", "probabilistic", "deterministic")
                        if getattr(s, p) is not None],
             "source": f"{s.source}:{s.line}" if s.source else None}
            for s in registry.skills]
    errors = [str(e) for e in registry.errors]
    if args.json:
        _print_json({"skills": rows, "errors": errors})
    else:
        for row in rows:
            print(f"{row['name']:<20} priority {row['priority']:<4} "
                  f"{'+'.join(row['phases']):<36} {row['source']}")
        for error in errors:
            print(f"BROKEN {error}", file=sys.stderr)
    return EXIT_FAILED if args.check and errors else EXIT_OK


def cmd_read_action(args: argparse.Namespace) -> int:
    from opencortex.runtime import build_kernel
    from opencortex.verification import judge
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    config = load_config(args.home)

    async def dry_run():
        kernel = build_kernel(config)
        try:
            event = chat_message("(read-action dry run)", args.channel, "dry-run")
            return judge(text, kernel.skills.skills, await kernel.context(event), kernel.tools,
                         max_bytes=config.max_reply_bytes, max_depth=config.max_reply_depth)
        finally:
            await kernel.aclose()

    verdict = asyncio.run(dry_run())
    if args.json:
        _print_json(verdict.as_json())
    else:
        print(f"verdict: {verdict.status}")
        if verdict.action is not None:
            print(f"action:  {verdict.action.printed()}")
        for error in verdict.errors:
            print(f"error:   {error}")
        if verdict.approval_reason:
            print(f"approval: {verdict.approval_reason}")
        if verdict.ignored:
            print(f"ignored: {verdict.ignored!r}")
    return EXIT_OK if verdict.accepted else EXIT_FAILED


def cmd_memory(args: argparse.Namespace) -> int:
    from opencortex.memory import Archive
    config = load_config(args.home)
    archive = Archive(config.memory_dir)
    try:
        if args.memory_command == "reindex":
            count = archive.reindex()
            print(f"reindexed {count} messages from {config.memory_dir}")
            return EXIT_OK
        thread = Thread.parse(args.thread) if args.thread else None
        hits = archive.search(args.query, thread=thread, limit=args.limit)
    finally:
        archive.close()
    if args.json:
        _print_json([hit.model_dump() for hit in hits])
    else:
        for hit in hits:
            print(f"{hit.channel}:{hit.chat_id}  {hit.role:<9} {hit.id}  {hit.snippet}")
        if not hits:
            print("no matches", file=sys.stderr)
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from opencortex.serve import serve
    config = _config_for(args)
    return asyncio.run(serve(config, port=args.port, connection_file=args.connection_file))


def cmd_doctor(args: argparse.Namespace) -> int:
    from opencortex.doctor import run_checks
    config = load_config(args.home)
    failed = 0
    for check in run_checks(config):
        mark = "ok " if check.ok else ("-- " if check.optional else "NO ")
        print(f"{mark} {check.name}: {check.detail}")
        if not check.ok:
            print(f"    fix: {check.fix}")
            failed += 0 if check.optional else 1
    return EXIT_FAILED if failed else EXIT_OK


COMMANDS = {"chat": cmd_chat, "skills": cmd_skills, "read-action": cmd_read_action,
            "memory": cmd_memory, "serve": cmd_serve, "doctor": cmd_doctor}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args)
    except (ConfigError, EventError, ValueError) as error:
        return _fail(str(error))
    except OSError as error:
        return _fail(f"{error.filename or ''}: {error.strerror or error}")
    except KeyboardInterrupt:
        return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
