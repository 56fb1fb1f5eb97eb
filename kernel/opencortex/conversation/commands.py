"""Slash commands, the same in every channel (Emacs buffer, terminal, bridges).

A command reads or changes the conversation of the thread it was typed in and
answers with text for the person.  Changes are written to the archive as
control records by the thread log, so they survive a restart.  What a command
shows is a view: never the system prompt.

What is a command: a message whose first word is "/" and a letter, then
letters or hyphens (`/help`, `/rewind 3`, `/no-such-thing`).  An unknown one
is an error naming the closest command, never a chat message; text whose
first word is a path or anything else ("/etc/hosts is odd", "/5", "//x")
goes to the model.  `/quit` belongs to the frontends that can leave (the
terminal and Emacs intercept it); elsewhere it answers that it means nothing.
"""

from __future__ import annotations

import shlex

from opencortex.conversation import branchcommands  # noqa: F401  (registers its commands)
from opencortex.conversation.commandline import (  # noqa: F401  (is_command: for callers)
    FREE_TEXT, HANDLERS, OWNERS_ONLY, USAGE, CommandError, CommandInput, command, first_word,
    is_command, number_argument, rest_argument, short, unknown_command)
from opencortex.conversation.conversations import Conversation, Conversations
from opencortex.conversation.delivery import as_seen

FRONTENDS_THAT_QUIT = ("cli", "emacs")


class Commands:
    """Runs slash commands against the conversations of one kernel."""

    def __init__(self, conversations: Conversations):
        self.conversations = conversations

    async def run(self, conversation: Conversation, text: str,
                  given: CommandInput | None = None) -> str:
        """Run the command TEXT on CONVERSATION; CommandError when it is unknown or misused."""
        name = first_word(text).removeprefix("/")
        handler = HANDLERS.get(name)
        if handler is None:
            raise CommandError(unknown_command(name))
        given = given or CommandInput()
        if given.guest and name in OWNERS_ONLY:
            raise CommandError(f"/{name} changes the kernel for every chat, so only its owner "
                               "may run it (from Emacs, the terminal, or a chat [llm.owners] "
                               "names)")
        if name in FREE_TEXT:
            return await handler(self, conversation, rest_argument(text), given)
        try:
            words = shlex.split(text.strip())
        except ValueError as error:
            raise CommandError(f"cannot read the command: {error}; close the quote or "
                               "leave it out") from None
        return await handler(self, conversation, words[1:], given)

    async def off_loop(self, function, *args, **kwargs):
        """FUNCTION(*ARGS, **KWARGS) run by a reading thread: a command's disk work (a
        control record appended and fsynced, a rewrite, a search, skills compiled)
        never holds up the event loop.  The thread's lock keeps its turns out meanwhile."""
        return await self.conversations.read(function, *args, **kwargs)


@command("help", "/help — the commands")
async def _help(commands: Commands, conv: Conversation, args: list[str],
                given: CommandInput) -> str:
    return "\n".join(USAGE[name] for name in sorted(USAGE))


@command("history", "/history [n] — the last n turns of this branch (default 10)")
async def _history(commands: Commands, conv: Conversation, args: list[str],
                   given: CommandInput) -> str:
    count = number_argument(args[0], "n") if args else 10
    show_thoughts = commands.conversations.settings.show_thoughts
    turns = conv.log.last_turns(count) if count else []
    store = commands.conversations.store_for(conv.thread)
    gone = await commands.off_loop(store.undelivered, [r.id for t in turns for r in t.records])
    lines = []
    for turn in turns:
        for record in turn.records:
            if record.turn_type == "thought" and not show_thoughts:
                continue
            text = as_seen(short(record.text), record.id in gone)
            lines.append(f"{turn.number:>4} {record.role:<9} {text}")
    return "\n".join(lines) or "No turns on this branch yet."


@command("context", "/context — what the model sees now: entries, classes, pressure")
async def _context(commands: Commands, conv: Conversation, args: list[str],
                   given: CommandInput) -> str:
    context = conv.context
    lines = [f"Branch {conv.log.branch}, strategy {context.strategy}, "
             f"{context.used}/{context.budget} tokens (pressure {context.pressure:.0%}, "
             f"{context.state}); the system prompt and persona come first and are not shown."]
    for row in context.view():
        lines.append(f"  turn {row['turn']:>4} {row['role']:<9} {row['retention']:<9} "
                     f"{row['kind']:<8} {row['tokens']:>5} tok  {short(row['text'], 60)}")
    if conv.recalled:
        lines.append("Recalled for the latest turn:")
        lines += [f"  {short(entry.text, 90)}" for entry in conv.recalled]
    if context.last_report is not None:
        lines.append(f"Last compression: {context.last_report.notes}")
    return "\n".join(lines)


@command("metrics", "/metrics — turns, tokens, cost, latency")
async def _metrics(commands: Commands, conv: Conversation, args: list[str],
                   given: CommandInput) -> str:
    session = conv.session
    figures = {"state": session.state, "turns": session.turns, "session tokens": session.tokens,
               **given.metrics}
    return "\n".join(f"{name}: {value}" for name, value in figures.items())


@command("budget", "/budget — what is left of this chat's token and cost budgets")
async def _budget(commands: Commands, conv: Conversation, args: list[str],
                  given: CommandInput) -> str:
    return given.budget or "No budget applies to this chat."


@command("forget", "/forget — remove this chat from memory for good (asks first; "
                   "/forget yes does it)")
async def _forget(commands: Commands, conv: Conversation, args: list[str],
                  given: CommandInput) -> str:
    conversations = commands.conversations
    if args not in ([], ["yes"]):
        raise CommandError("usage: /forget, then /forget yes to confirm")
    if not args:
        count = await conversations.forget(conv.thread, apply=False)
        if not count:
            return "Nothing of this chat is in memory."
        return (f"This removes all {count} messages of this chat from memory (the archive "
                "and its search index), for good. Send /forget yes to do it.")
    count = await conversations.forget(conv.thread, apply=True)
    return f"Forgot {count} messages of this chat; it starts empty now."


@command("reset", "/reset — start afresh on a new empty branch (nothing is deleted)")
async def _reset(commands: Commands, conv: Conversation, args: list[str],
                 given: CommandInput) -> str:
    name = (await commands.off_loop(conv.log.start_afresh) if conv.log.turn_count()
            else conv.log.branch)
    conv.session.reset()
    await commands.conversations.refill(conv)
    return f"Started afresh on branch {name}; earlier turns stay in the archive."


@command("save", "/save [name] — save this conversation (branch and turn) under a name",
         free_text=True)
async def _save(commands: Commands, conv: Conversation, args: list[str],
                given: CommandInput) -> str:
    name = " ".join(args) or f"{conv.thread.channel}-{conv.thread.chat_id}-{conv.log.branch}"
    first = conv.log.turns()[0].records[0].text if conv.log.turn_count() else ""
    saved = commands.conversations.saved
    _, let_go = await commands.off_loop(saved.save_reporting, name, conv.thread,
                                        conv.log.branch, conv.log.head, short(first, 60),
                                        owner=commands.conversations.owner(conv.thread))
    answer = f"Saved as {name!r} (branch {conv.log.branch}, {conv.log.turn_count()} turns)."
    if let_go is not None:
        answer += (f" {let_go!r} was let go: you keep the {saved.per_owner} names saved "
                   "most recently.")
    return answer


@command("load", "/load NAME — continue a saved conversation", free_text=True)
async def _load(commands: Commands, conv: Conversation, args: list[str],
                given: CommandInput) -> str:
    if not args:
        raise CommandError("usage: /load NAME (see /sessions)")
    name = " ".join(args)
    saved = await commands.off_loop(commands.conversations.saved.get, name,
                                    owner=commands.conversations.owner(conv.thread))
    if saved is None:
        raise CommandError(f"no saved session named {name!r}; /sessions lists them")
    if saved.thread != conv.thread:
        raise CommandError(f"{name!r} belongs to {saved.thread}; load it there (threads never "
                           "share a conversation)")
    if saved.branch in conv.log.branches() and conv.log.reaches(saved.branch, saved.head):
        await commands.off_loop(conv.log.switch, saved.branch)   # it only grew since
    elif saved.head:
        await commands.off_loop(conv.log.fork, at=saved.head)
    else:
        await commands.off_loop(conv.log.start_afresh)
    await commands.conversations.refill(conv)
    count = conv.log.turn_count()
    answer = f"Loaded {name!r}: you are on branch {conv.log.branch} with {count} turns."
    at = conv.log.turn_of(saved.head) if saved.head else None
    if at is not None and at < count:
        answer += f" It was saved at turn {at}; /rewind {at} goes back there."
    return answer


@command("sessions", "/sessions [text] — saved sessions (matching text)", free_text=True)
async def _sessions(commands: Commands, conv: Conversation, args: list[str],
                    given: CommandInput) -> str:
    saved = commands.conversations.saved
    owner = commands.conversations.owner(conv.thread)
    found = await commands.off_loop(saved.search, " ".join(args), owner=owner) if args \
        else await commands.off_loop(saved.list, owner=owner)
    return "\n".join(f"{s.name}  ({s.thread}, branch {s.branch})  {s.title}"
                     for s in found) or "No saved sessions."


@command("recall", "/recall QUERY — search your earlier conversations (this owner only)",
         free_text=True)
async def _recall(commands: Commands, conv: Conversation, args: list[str],
                  given: CommandInput) -> str:
    if not args:
        raise CommandError("usage: /recall QUERY")
    return await commands.off_loop(commands.conversations.recall.explain, conv.thread,
                                   " ".join(args), k=10)


@command("persona", "/persona — the persona note the kernel uses")
async def _persona(commands: Commands, conv: Conversation, args: list[str],
                   given: CommandInput) -> str:
    return given.persona or "No persona note is loaded."


@command("strategy", "/strategy [NAME] — show or choose: sliding, forget, summarize or galois")
async def _strategy(commands: Commands, conv: Conversation, args: list[str],
                    given: CommandInput) -> str:
    if not args:
        return f"Compression strategy: {conv.context.strategy}."
    name = args[0].lower()
    conv.context.set_strategy(name)         # ValueError naming the strategies
    await commands.off_loop(conv.log.set_strategy, name)
    return f"Compression strategy for this chat: {name} (kept across restarts)."


@command("reload", "/reload — load the skills again from disk", owners_only=True)
async def _reload(commands: Commands, conv: Conversation, args: list[str],
                  given: CommandInput) -> str:
    if given.skills is None:
        raise CommandError("/reload needs the kernel's skills, which this caller did not give")
    errors = await commands.off_loop(given.skills.reload)
    lines = [f"Reloaded {len(given.skills.skills)} skills."]
    lines += [f"Broken: {error}" for error in errors]
    return "\n".join(lines)


@command("quit", "/quit — leave the chat (terminal and Emacs)")
async def _quit(commands: Commands, conv: Conversation, args: list[str],
                given: CommandInput) -> str:
    if conv.thread.channel in FRONTENDS_THAT_QUIT:
        return ("/quit leaves the interactive terminal chat and closes the Emacs chat; "
                "a single message has nothing to leave.")
    return (f"/quit means nothing on {conv.thread.channel}: this chat stays open. "
            "/reset starts afresh.")
