"""Token and cost budgets per session and per owner, enforced before a model is called.

Who has a budget is decided by the observer archetype (`[budget.<archetype>]`,
see `budget_settings`).  Before each model call the kernel asks `admit`:

- below `short_at` of every limit: a normal turn;
- from `short_at` on: the short-answer tier (a "tier": "short" row of the model
  table and a smaller output cap), announced once per budget and period;
- used up: on a channel that can ask its owner, an approval ("extend by N
  tokens?", action class "budget"); a yes grants N tokens more.  Elsewhere, or
  on a no, the turn fails with RATE_LIMITED and when the budget renews.

After the turn `record` charges what the reply used to every budget of the
thread.  Usage lives in `budget_store` (SQLite in the home), so a restart
changes nothing.  `collapse_notice` announces a session's collapse at its
`max_turns`/`max_tokens` before it happens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Awaitable, Callable, Mapping

from opencortex.approvals import ApprovalDecision, ApprovalRequest, Approver, action_digest
from opencortex.budget_settings import ArchetypeBudget, BudgetSettings
from opencortex.budget_store import STORE_NAME, BudgetStore, Used
from opencortex.conversation.recall import owner_of
from opencortex.conversation.session import Session
from opencortex.conversation.settings import ConversationSettings
from opencortex.events import Event, Thread
from opencortex.llm import PromptRequest, Usage
from opencortex.llm.routing import archetype_for
from opencortex.llm.settings import LLMSettings
from opencortex.turn import TurnFailed

BUDGET = "budget"   # the approval's action class
Asker = Callable[[Approver, ApprovalRequest], Awaitable[ApprovalDecision]]
DAY = 86_400


def day_before(now: float) -> str:
    """The UTC day ("YYYY-MM-DD") before the one NOW (epoch seconds) falls in."""
    return time.strftime("%Y-%m-%d", time.gmtime(now - DAY))


@dataclass(frozen=True)
class Scope:
    """One budget of a thread: its store key, period, limits and what it used."""

    label: str                    # "this chat" / "owner alice"
    key: str
    period: str
    tokens: int | None
    cost: float | None
    used: Used

    @property
    def share(self) -> float:
        """How much of this budget is used (1.0 = all of it)."""
        shares = [0.0]
        if self.tokens:
            shares.append(self.used.tokens / (self.tokens + self.used.granted))
        if self.cost:
            # Granted tokens raise a cost limit at the average price paid so far.
            price = self.used.cost / self.used.tokens if self.used.tokens else 0.0
            shares.append(self.used.cost / (self.cost + self.used.granted * price))
        return max(shares)

    def line(self) -> str:
        """What is left, in one line for a person."""
        parts = []
        if self.tokens:
            parts.append(f"{self.used.tokens:,} of {self.tokens + self.used.granted:,} tokens")
        if self.cost:
            parts.append(f"${self.used.cost:.4f} of ${self.cost:g}")
        return f"{self.label}: {', '.join(parts)} used ({min(self.share, 1):.0%})"


class Budgets:
    """The budgets of one kernel (no store, and no cost, when none is configured)."""

    def __init__(self, settings: BudgetSettings, llm: LLMSettings,
                 owners: Mapping[str, str], store: BudgetStore | None, *,
                 clock: Callable[[], float] = time.time):
        self.settings = settings
        self.llm = llm
        self.owners = owners
        self.store = store
        self.clock = clock
        self._warned: set[Thread] = set()   # sessions whose collapse was announced
        self._day: str | None = None        # the daily period last seen (to prune older)

    @classmethod
    def from_config(cls, config) -> Budgets:
        """Budgets for CONFIG; the store is opened only when some archetype has a budget."""
        settings: BudgetSettings = config.budget
        store = (BudgetStore(config.home / STORE_NAME, keep_from=day_before(time.time()))
                 if settings.__pydantic_extra__ else None)
        return cls(settings, config.llm, config.conversation.owners, store)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    # -- what applies ---------------------------------------------------------

    def _budget(self, thread: Thread) -> tuple[str, ArchetypeBudget | None]:
        archetype = archetype_for(thread, self.llm)
        return archetype, self.settings.for_archetype(archetype)

    def _period(self, budget: ArchetypeBudget) -> str:
        """BUDGET's current period: today (UTC) when it renews daily, else "always".
        A new day lets the store forget the days before yesterday."""
        if budget.renew != "daily":
            return "always"
        now = self.clock()
        day = time.strftime("%Y-%m-%d", time.gmtime(now))
        if day != self._day and self.store is not None:
            self._day = day
            self.store.prune(day_before(now))
        return day

    def renews(self, budget: ArchetypeBudget) -> str:
        """When BUDGET renews, for a person."""
        if budget.renew == "never":
            return "it does not renew; the owner can raise it in [budget]"
        midnight = (int(self.clock()) // DAY + 1) * DAY
        return "it renews at " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(midnight))

    def renews_in(self, budget: ArchetypeBudget) -> float | None:
        """Seconds until BUDGET renews (None: it never does)."""
        if budget.renew == "never":
            return None
        now = self.clock()
        return float((int(now) // DAY + 1) * DAY - now)

    def scopes(self, thread: Thread) -> list[Scope]:
        """The budgets that apply to THREAD, with what each used this period."""
        _, budget = self._budget(thread)
        if budget is None or self.store is None:
            return []
        period = self._period(budget)
        found = []
        owner = owner_of(thread, self.owners)
        for scope, key, label in (("session", f"session:{thread}", "this chat"),
                                  ("owner", f"owner:{owner}", f"owner {owner}")):
            tokens, cost = budget.limits(scope)
            if tokens or cost:
                found.append(Scope(label, key, period, tokens, cost,
                                   self.store.used(key, period)))
        return found

    # -- before and after a turn ----------------------------------------------

    async def admit(self, event: Event, *, can_ask: bool, approver: Approver | None,
                    ask: Asker, tell: Callable[[str], Awaitable[object]],
                    timeout: float) -> str:
        """The tier EVENT's turn may use ("normal" or "short"), before any model call.

        A used-up budget is extended by an owner's yes (ASK puts the request to
        APPROVER), or the turn fails (TurnFailed "RATE_LIMITED: …" saying when the
        budget renews)."""
        scopes = self.scopes(event.thread)
        spent = [scope for scope in scopes if scope.share >= 1]
        if spent:
            await self._extend_or_refuse(event, spent, can_ask and approver is not None,
                                         partial(ask, approver), timeout)
            scopes = self.scopes(event.thread)
        near = [scope for scope in scopes if scope.share >= self.settings.short_at]
        if not near:
            return "normal"
        assert self.store is not None
        for scope in near:
            if not scope.used.announced:
                self.store.mark_announced(scope.key, scope.period)
                await tell(f"Budget nearly used ({scope.line()}): replies are kept short "
                           "from now on.")
        return "short"

    async def _extend_or_refuse(self, event: Event, spent: list[Scope], can_ask: bool,
                                ask: Callable[[ApprovalRequest], Awaitable[ApprovalDecision]],
                                timeout: float) -> None:
        """Ask the owner to extend SPENT budgets, or raise TurnFailed(RATE_LIMITED)."""
        assert self.store is not None
        _, budget = self._budget(event.thread)
        assert budget is not None
        grant = self.settings.extend_by
        how = "this channel cannot ask the owner"
        if can_ask:
            facts = "; ".join(scope.line() for scope in spent)
            request = ApprovalRequest(
                thread=event.thread, action_class=BUDGET, timeout=timeout,
                title=f"Extend the budget by {grant:,} tokens?", action=facts,
                requested_by=event.sender or "", asked_in=event.message_id or "",
                digest=action_digest(f"{facts} +{grant}"))
            decision = await ask(request)
            if decision.approved:
                for scope in spent:
                    self.store.grant(scope.key, scope.period, grant)
                return
            how = f"the extension was {decision.how}"
        raise TurnFailed(f"RATE_LIMITED: the budget is used up ({spent[0].line()}; {how}); "
                         f"{self.renews(budget)}", retry_after_seconds=self.renews_in(budget))

    def route(self, request: PromptRequest, tier: str) -> PromptRequest:
        """REQUEST routed to TIER: the short tier names its rows and caps the output."""
        if tier != "short":
            return request
        routing = {**request.routing, "tier": "short",
                   "max_tokens": str(self.settings.short_max_tokens)}
        return request.model_copy(update={"routing": routing})

    def record(self, thread: Thread, usage: Usage | None) -> None:
        """Charge what a turn used to every budget of THREAD."""
        if usage is None or self.store is None:
            return
        tokens = usage.input_tokens + usage.output_tokens
        for scope in self.scopes(thread):
            self.store.charge(scope.key, scope.period, tokens, usage.cost_usd or 0.0)

    def collapse_notice(self, session: Session, limits: ConversationSettings) -> str | None:
        """Once per session, before it collapses: how much of max_turns/max_tokens is left."""
        if session.state == "collapsed":
            return None
        turns_left = None if limits.max_turns is None else limits.max_turns - session.turns
        share = max(session.turns / limits.max_turns if limits.max_turns else 0.0,
                    session.tokens / limits.max_tokens if limits.max_tokens else 0.0)
        near = share >= self.settings.session_warn_at or turns_left == 1
        if not near:
            self._warned.discard(session.thread)
            return None
        if session.thread in self._warned:
            return None
        self._warned.add(session.thread)
        left = []
        if turns_left is not None:
            left.append(f"{turns_left} of {limits.max_turns} turns")
        if limits.max_tokens:
            left.append(f"{max(0, limits.max_tokens - session.tokens):,} of "
                        f"{limits.max_tokens:,} tokens")
        return (f"This session is nearly at its limit ({' and '.join(left)} left); it will "
                "close then, and /reset starts afresh.")

    # -- for /budget ------------------------------------------------------------

    def describe(self, thread: Thread) -> str:
        """What is left of THREAD's budgets, for /budget."""
        archetype, budget = self._budget(thread)
        scopes = self.scopes(thread)
        if budget is None or not scopes:
            return f"No budget applies to this chat ({archetype})."
        lines = [f"Budget ({archetype}, {budget.renew}; {self.renews(budget)}):"]
        lines += [f"  {scope.line()}" for scope in scopes]
        lines.append(f"Short answers from {self.settings.short_at:.0%}; when it is used up "
                     "the owner is asked to extend it where this channel can ask, else "
                     "replies stop until it renews.")
        return "\n".join(lines)
