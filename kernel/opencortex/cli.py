"""The `opencortex` command: argument parsing and printing only.

Light at import (no pydantic, no asyncio): `serve` prints its port line before it
reads the configuration (see `serve_port`), so each command imports what it needs.

Exit codes and `--json` follow one contract (see `opencortex.clireport`):
0 ok, 1 failed, 2 usage; with `--json` standard output is exactly one JSON
object, errors included: {"status": "error", "error": "...", "errors": [...],
"exit": N} when the command could not run.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from opencortex import __version__
from opencortex.clireport import (EXIT_FAILED, EXIT_OK, EXIT_USAGE, Parser, UsageError, fail,
                                  print_json, reader_gone, usage_failure, wants_json)
from opencortex.error_place import unexpected
from opencortex.homeaccess import HomeNotWritable, require_writable_home, sole_writer
from opencortex.homelock import HomeInUse
from opencortex.homepath import home_of
from opencortex.log_lines import log_to_stderr

if TYPE_CHECKING:
    from opencortex.config import Config
    from opencortex.events import Thread
    from opencortex.serve_port import Bound, StopSignals

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "build_parser", "main"]


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
    from opencortex.config import load_config
    config = load_config(args.home, backend=args.backend, script=args.script)
    if args.script and not args.backend:
        config = config.model_copy(update={"backend": "script"})
    if args.model:
        config = config.model_copy(update={"llm": config.llm.model_copy(
            update={"model": args.model})})
    return config


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = _common(top=False)
    parser = Parser(prog="opencortex", parents=[_common(top=True)], description=(
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

    skills = sub.add_parser("skills", parents=[common],
                            help="list the loaded skills and tools")
    skills.add_argument("--json", action="store_true")
    skills.add_argument("--check", action="store_true",
                        help="exit non-zero and name file:line when a skill is broken")

    read = sub.add_parser("read-action", parents=[common],
                          help="dry run: how a model reply is read and judged")
    read.add_argument("file", nargs="?", default="-", help="reply text file, or - for stdin")
    read.add_argument("--channel", default="cli", help="channel the reply answers (default cli)")
    read.add_argument("--chat-id", default="dry-run",
                      help="chat id (room id) of the conversation the reply answers "
                           "(default dry-run); a reply addressed elsewhere is refused")
    read.add_argument("--json", action="store_true")

    memory = sub.add_parser("memory", parents=[common], help="search or reindex the archive")
    memory_sub = memory.add_subparsers(dest="memory_command", metavar="ACTION", required=True)
    search = memory_sub.add_parser("search", parents=[common], help="full-text search")
    search.add_argument("query")
    search.add_argument("--thread", help="only this thread (CHANNEL:CHAT-ID)")
    search.add_argument("--limit", type=_at_least_one, default=10, help="most hits (10)")
    search.add_argument("--json", action="store_true")
    memory_sub.add_parser("reindex", parents=[common], help="rebuild the index from the org files")
    forget = memory_sub.add_parser("forget", parents=[common],
                                   help="remove a thread's messages from the archive and index")
    forget.add_argument("--thread", required=True, help="the thread (CHANNEL:CHAT-ID)")
    forget.add_argument("--before", help="only messages older than this date (YYYY-MM-DD)")
    forget.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    imports = memory_sub.add_parser(
        "import", parents=[common], help="bring earlier history in (JSON Lines, Telegram export)",
        description="Archive earlier messages with their original times; importing the same "
        "file again adds nothing.  JSON Lines: one {thread, role, sender, timestamp, text} "
        "object per line (timestamp: ISO 8601, local time when it names no zone, or epoch "
        "seconds).  A Telegram Desktop chat export (result.json): every message is a user "
        "message under its sender's id, yours and other people's alike, except those of an "
        "--assistant.  A line that cannot be read is reported by number and skipped (exit 1).  "
        "FILE may be a pipe (/dev/stdin).")
    imports.add_argument("file", type=Path, help="the .jsonl file or the export's result.json")
    imports.add_argument("--format", choices=["auto", "jsonl", "telegram"], default="auto",
                         help="the file's format (default: told from its start)")
    imports.add_argument("--thread", help="Telegram: the thread to import into (default: "
                         "telegram:CHAT-ID of the export); JSON Lines: for lines naming none")
    imports.add_argument("--assistant", action="append", default=[], metavar="NAME_OR_ID",
                         help="Telegram: this sender (name, from_id or number) speaks as the "
                              "assistant; repeat for several")
    imports.add_argument("--json", action="store_true")

    serve = sub.add_parser("serve", parents=[common],
                           help="run as an EPC server for Emacs (prints the port first)")
    serve.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free)")
    serve.add_argument("--connection-file", type=Path,
                       help="where to write port and secret (default: the runtime dir)")
    serve.add_argument("--ws", type=int, metavar="PORT", dest="ws_port",
                       help="also serve the ChatEvent wire (WebSocket) on 127.0.0.1:PORT "
                            "(0: any free port)")
    _backend_options(serve)

    client = sub.add_parser("client", parents=[common],
                            help="chat with the running kernel over its WebSocket wire")
    client.add_argument("--url", help="ws://127.0.0.1:PORT (default: the connection file's)")
    client.add_argument("--connection-file", type=Path,
                        help="the kernel's connection file (default: the home's)")
    client.add_argument("--thread", default="wire", help="the conversation, cli:NAME (wire)")

    sub.add_parser("doctor", parents=[common], help="what is present and missing, with fixes")
    return parser


def _print_json(data: Any) -> None:
    print_json(data)


def _fail(message: str, code: int = EXIT_FAILED, *, as_json: bool = False) -> int:
    return fail(message, as_json=as_json, code=code)


# -- commands -----------------------------------------------------------------

async def _chat_once(config: Config, args: argparse.Namespace, thread: Thread) -> int:
    from opencortex.events import chat_message
    from opencortex.runtime import build_kernel
    shown: list[str] = []
    kernel = build_kernel(config, writer=shown.append if args.json else None)
    try:
        await kernel.start()
        if not args.json:
            for warning in _startup_warnings(kernel):
                print(f"warning: {warning}", file=sys.stderr)
        event = chat_message(args.message, thread.channel, thread.chat_id)
        if args.session:
            loaded = await kernel.run_command(thread, f"/load {shlex.quote(args.session)}")
            if not args.json:
                print(loaded, file=sys.stderr)
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
    """The terminal chat (see `opencortex.terminal`)."""
    from opencortex.terminal import run_chat
    return await run_chat(config, thread, session=session)


def cmd_chat(args: argparse.Namespace) -> int:
    import asyncio
    from opencortex.events import Thread, chat_message
    config = _config_for(args)
    thread = Thread.parse(args.thread)
    if args.message is not None:
        chat_message(args.message, thread.channel, thread.chat_id)    # refuse blank text first
    require_writable_home(config.home, "chatting")
    with sole_writer(config):
        if args.message is not None:
            return asyncio.run(_chat_once(config, args, thread))
        return asyncio.run(_chat_loop(config, thread, args.session))


def cmd_skills(args: argparse.Namespace) -> int:
    from opencortex.skills_command import run_skills_command
    return run_skills_command(args)


def cmd_read_action(args: argparse.Namespace) -> int:
    """Judge a reply exactly as a turn would, pinning rule and approval policy included.
    No channel can approve in a dry run, so a reply to another conversation shows as
    rejected, with the address it must use."""
    import asyncio
    from opencortex.config import load_config
    from opencortex.events import chat_message
    from opencortex.runtime import build_kernel
    from opencortex.untrusted import visible
    # Undecodable bytes become lone surrogates, which the reader refuses with their place.
    raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    text = raw.decode("utf-8", errors="surrogateescape")
    config = load_config(args.home)

    async def dry_run():
        kernel = build_kernel(config)
        try:
            await kernel.start()   # MCP tools are checked like any other
            event = chat_message("(read-action dry run)", args.channel, args.chat_id)
            # Judged exactly as a turn judges a reply: skills, pinning, approval policy.
            conversation = await kernel.conversations.open(event.thread)
            prepared = await kernel.preparation.prepare(event, conversation, kernel.persona)
            return await kernel.replies.judged(text, prepared.ctx)
        finally:
            await kernel.aclose()

    verdict = asyncio.run(dry_run())
    if args.json:
        _print_json(verdict.as_json())
    else:
        print(f"verdict: {verdict.status}")
        if verdict.action is not None:
            print(f"action:  {visible(verdict.action.printed())}")
        for error in verdict.errors:
            print(f"error:   {visible(error)}")
        if verdict.approval_reason:
            print(f"approval: {visible(verdict.approval_reason)}")
        if verdict.ignored:
            print(f"ignored: {visible(repr(verdict.ignored))}")
    return EXIT_OK if verdict.accepted else EXIT_FAILED


def cmd_memory(args: argparse.Namespace) -> int:
    from opencortex.memory_commands import run_memory_command
    return run_memory_command(args)


def cmd_serve(args: argparse.Namespace) -> int:
    """The home's lock held and the port line printed first, then the configuration read
    and the kernel built (see `serve_port`); with --ws the kernel first, since the
    wire's port goes in the connection file too."""
    from opencortex.serve_port import Stopped, bound_port, noting_stop_signals
    home = home_of(args.home)
    require_writable_home(home, "serving")
    try:
        if args.ws_port is not None:
            return _serve(args)
        with noting_stop_signals() as signals, bound_port(
                home, port=args.port, connection_file=args.connection_file) as bound:
            bound.announce(sys.stdout)
            return _serve(args, bound, signals)
    except Stopped:                     # before the kernel's loop took the signals over
        return EXIT_OK
    except HomeInUse as error:
        return _fail(str(error))


def _serve(args: argparse.Namespace, bound: Bound | None = None,
           signals: StopSignals | None = None) -> int:
    """Read the configuration and serve, on BOUND when the port is bound already (SIGNALS:
    the stop signals noted since, handed on to the kernel's loop)."""
    from opencortex.eventloop import EventLoopUnavailable, run
    from opencortex.serve import serve, serve_bound
    config = _config_for(args)
    if signals is not None:
        signals.check()                 # stopped while the configuration was read
    try:
        if bound is not None:
            return run(serve_bound(config, bound, noted=signals), config.event_loop)
        return run(serve(config, port=args.port, connection_file=args.connection_file,
                         ws_port=args.ws_port), config.event_loop)
    except EventLoopUnavailable as error:
        return _fail(str(error))


def cmd_client(args: argparse.Namespace) -> int:
    import asyncio
    from opencortex.serve_port import default_connection_file
    from opencortex.wire_client import WireError, endpoint, run_client
    args.connection_file = args.connection_file or default_connection_file(home_of(args.home))
    try:
        url, token = endpoint(args)
    except WireError as error:
        return _fail(str(error))
    return asyncio.run(run_client(url, token, args.thread))


def cmd_doctor(args: argparse.Namespace) -> int:
    from opencortex.config import load_config
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
            "memory": cmd_memory, "serve": cmd_serve, "client": cmd_client,
            "doctor": cmd_doctor}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ARGV; returns the exit code (see `opencortex.clireport`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as error:
        error.parser = _usage_parser(error.parser, argv)
        return usage_failure(error, as_json=wants_json(argv))
    log_to_stderr(args.verbose)
    as_json = bool(getattr(args, "json", False))
    if args.command is None:
        if as_json:
            return _fail("name a command: " + ", ".join(COMMANDS), EXIT_USAGE, as_json=True)
        parser.print_help()
        return EXIT_USAGE
    return _run(args, as_json)


def _usage_parser(parser: argparse.ArgumentParser,
                  argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser whose usage fits a bad command line: the named (sub)command's, not the
    top one's (argparse reports leftover arguments from the top)."""
    for _ in range(3):                                   # opencortex COMMAND ACTION at most
        choices = getattr(getattr(parser, "subcommands", None), "choices", {})
        name = next((word for word in argv if word in choices), None)
        if name is None:
            break
        parser = choices[name]
    return parser


def _run(args: argparse.Namespace, as_json: bool) -> int:
    """Run the parsed command; every failure becomes one report, never a traceback."""
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:         # whoever read standard output stopped (`| head`)
        return reader_gone()
    except (HomeNotWritable, HomeInUse) as error:
        return _fail(str(error), as_json=as_json)
    except ValueError as error:     # ConfigError and EventError among them: they say it
        return _fail(str(error), as_json=as_json)
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        return _fail(f"{where}{error.strerror or error}", as_json=as_json)
    except KeyboardInterrupt:
        return _fail("interrupted", as_json=as_json)
    except Exception as error:      # a bug: say so plainly; -v logs where it happened
        from opencortex.memory import ArchiveError
        if isinstance(error, ArchiveError):                   # says what to do itself
            return _fail(str(error), as_json=as_json)
        logging.getLogger(__name__).info("%s", unexpected(error))
        return _fail(f"unexpected {type(error).__name__}; please report it (run with -v "
                     "for details)", as_json=as_json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
