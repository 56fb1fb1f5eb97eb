"""The slash commands of branches and pins: /fork, /rewind, /branches, /switch, /merge,
/pin and /unpin (registered in `commandline`'s table; see `commands`)."""

from __future__ import annotations

from opencortex.conversation.commandline import (CommandError, CommandInput, command,
                                                 number_argument, short)
from opencortex.conversation.conversations import Conversation


@command("fork", "/fork [turn] — a new branch from that turn (default: now)")
async def _fork(commands, conv: Conversation, args: list[str],
                given: CommandInput) -> str:
    turn = number_argument(args[0], "turn") if args else None
    name = await commands.off_loop(conv.log.fork, turn)
    await commands.conversations.refill(conv)
    where = f"turn {turn}" if turn is not None else "the latest turn"
    return f"Forked branch {name} at {where}; you are on it now."


@command("rewind", "/rewind N — go back to turn N (later turns stay on their branch)")
async def _rewind(commands, conv: Conversation, args: list[str],
                  given: CommandInput) -> str:
    if not args:
        raise CommandError("usage: /rewind N")
    turn = number_argument(args[0], "N")
    kept = await commands.off_loop(conv.log.rewind, turn)
    if kept is None:
        return f"Branch {conv.log.branch} ends at turn {turn} already; nothing moved."
    await commands.conversations.refill(conv)
    return (f"Rewound branch {conv.log.branch} to turn {turn}. The later turns are on "
            f"branch {kept}: /switch {kept} gets back to them.")


@command("branches", "/branches — the branches of this chat, * marks the current one")
async def _branches(commands, conv: Conversation, args: list[str],
                    given: CommandInput) -> str:
    lines = []
    for row in conv.log.branch_summaries():
        mark = "*" if row["current"] else " "
        head = _head_question(conv, row["head"])
        lines.append(f"{mark} {row['name']:<8} {row['turns']:>4} turns, head at turn "
                     f"{row['head_turn']}{'  ' + head if head else ''}")
    return "\n".join(lines) + "\n/switch NAME moves to a branch."


def _head_question(conv: Conversation, head: str | None) -> str:
    """The user's message of the turn HEAD is in, shortened (walks back one turn)."""
    if head is None:
        return ""
    for record in reversed(conv.log.ancestors(head)):
        if record.role == "user":
            return repr(short(record.text, 50))
    return ""


@command("switch", "/switch NAME — move to branch NAME (see /branches)")
async def _switch(commands, conv: Conversation, args: list[str],
                  given: CommandInput) -> str:
    if len(args) != 1:
        names = ", ".join(conv.log.branches())
        raise CommandError(f"usage: /switch NAME (branches: {names})")
    if args[0] == conv.log.branch:
        return f"You are on branch {args[0]} already ({conv.log.turn_count()} turns)."
    await commands.off_loop(conv.log.switch, args[0])
    await commands.conversations.refill(conv)
    return f"Switched to branch {conv.log.branch} ({conv.log.turn_count()} turns)."


@command("merge", "/merge BRANCH — bring that branch's turns here, without duplicates")
async def _merge(commands, conv: Conversation, args: list[str],
                 given: CommandInput) -> str:
    if not args:
        names = ", ".join(sorted(conv.log.branches()))
        raise CommandError(f"usage: /merge BRANCH (branches: {names})")
    copied = await commands.off_loop(conv.log.merge, args[0])
    await commands.conversations.refill(conv)
    return f"Merged {len(copied)} messages from branch {args[0]} into {conv.log.branch}."


async def _pinning(commands, conv: Conversation, args: list[str], pin: bool) -> str:
    if not args:
        raise CommandError(f"usage: /{'pin' if pin else 'unpin'} N")
    turn = conv.log.turn(number_argument(args[0], "N"))
    marked = conv.log.pin if pin else conv.log.unpin
    changed = await commands.off_loop(lambda: sum(marked(i) for i in turn.ids))
    for message_id in turn.ids:
        (conv.context.pin if pin else conv.context.unpin)(message_id)
    if pin:
        await commands.conversations.refill(conv)
    verb = "Pinned" if pin else "Unpinned"
    return f"{verb} turn {turn.number} ({changed} messages changed)."


@command("pin", "/pin N — keep turn N in the context whatever happens (PRESERVED)")
async def _pin(commands, conv: Conversation, args: list[str],
               given: CommandInput) -> str:
    return await _pinning(commands, conv, args, True)


@command("unpin", "/unpin N — let turn N be compressed again")
async def _unpin(commands, conv: Conversation, args: list[str],
                 given: CommandInput) -> str:
    return await _pinning(commands, conv, args, False)
