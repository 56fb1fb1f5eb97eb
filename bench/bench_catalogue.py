"""SKILL.md catalogue benchmark (a script, not a test): prints figures, asserts nothing.

    python bench/bench_catalogue.py
    python bench/bench_catalogue.py --quick   # fewer load repetitions

Figures (tokens by `opencortex.llm.base.estimate_tokens`, about four characters each):
- prompt tokens the catalogue costs per SKILL.md skill, for the fixture skill
  (tests/fixtures/skillmd) and for a generated set of 20 realistic skills:
  target <= 100 tokens per skill (the spec's "~100 tokens of metadata");
- the same for the longest name and description the spec allows, and the
  `skill-load` tool's prompt line (paid once when any SKILL.md skill exists);
- the chat skill's whole system prompt (characters and tokens) with N tools
  (skill-load not counted) and M skills;
- time to load the 20 skills (parse, check, list files), per skill.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from pydantic import create_model

from opencortex.config import ChatSettings
from opencortex.events import chat_message
from opencortex.llm.base import estimate_tokens
from opencortex.skills import SkillContext, SkillRegistry
from opencortex.skills.skillmd import load_docs, skill_load_tool
from opencortex.tools import Tool, ToolRegistry

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "skillmd"
TARGET = 100
SKILLS = [
    ("pdf-processing", "Extracts text and tables from PDF files, fills PDF forms and merges "
     "documents. Use when the person mentions PDFs, forms or document extraction."),
    ("release-notes", "Drafts release notes from the git history since the last tag. Use when "
     "asked for release notes or a changelog entry."),
    ("code-review", "Reviews a diff for bugs, unclear names and missing tests, and answers with "
     "numbered findings. Use when the person asks for a review of a change or a patch."),
    ("meeting-notes", "Turns a meeting transcript into decisions, action items with owners and "
     "open questions. Use when given a transcript or asked to summarise a meeting."),
    ("org-agenda", "Reads and edits org-mode agenda files: schedules, deadlines, TODO states. "
     "Use for planning the day or week in org files."),
    ("sql-explain", "Explains a slow SQL query from its plan and suggests indexes. Use when "
     "the person pastes a query plan or asks why a query is slow."),
    ("commit-message", "Writes a conventional commit message from staged changes. Use when "
     "asked to write or improve a commit message."),
    ("csv-cleanup", "Cleans CSV files: fixes encodings, trims cells, unifies dates and "
     "removes duplicate rows. Use when a CSV file is messy or fails to import."),
    ("email-draft", "Drafts a short, polite email in the person's voice from bullet points. "
     "Use when asked to write or answer an email."),
    ("bibtex", "Builds and fixes BibTeX entries from DOIs, titles or citations. Use when "
     "working with references, citations or a .bib file."),
    ("docker-debug", "Diagnoses failing Docker builds and containers from logs and the "
     "Dockerfile. Use when a container will not build, start or stay up."),
    ("regex-helper", "Writes and explains regular expressions with test cases. Use when the "
     "person needs a pattern matched, extracted or replaced."),
    ("travel-plan", "Plans a trip day by day within a budget, with transport and opening "
     "hours. Use when asked to plan travel or an itinerary."),
    ("recipe-scale", "Scales a recipe to a number of servings and converts units. Use when "
     "cooking for a different number of people or converting measures."),
    ("api-client", "Generates a typed client for an HTTP API from its OpenAPI document. Use "
     "when the person wants to call a REST API from code."),
    ("test-writer", "Writes pytest tests for a function or module, covering edge cases. Use "
     "when asked to add or improve tests."),
    ("latex-table", "Turns tabular data into a LaTeX table with booktabs. Use when the person "
     "needs a table for a paper or report."),
    ("git-bisect", "Guides a git bisect session to find the commit that broke a test. Use "
     "when something worked before and is broken now."),
    ("invoice", "Builds an invoice from hours and rates as an org table with totals and tax. "
     "Use when asked to bill a client."),
    ("translate-doc", "Translates a document while keeping its markup and terminology. Use "
     "when asked to translate org, markdown or HTML files."),
]


def write_skills(root: Path, skills: list[tuple[str, str]]) -> None:
    """One SKILL.md folder per (name, description) under ROOT, with a script each."""
    for name, description in skills:
        folder = root / name
        (folder / "scripts").mkdir(parents=True)
        (folder / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: {description}\nlicense: MIT\n---\n"
            f"# {name}\n\n" + "Step by step instructions.\n" * 40)
        (folder / "scripts" / "run.sh").write_text("#!/bin/sh\necho ok\n")


def tool_registry(count: int) -> ToolRegistry:
    """COUNT tools with two typed arguments each, like skill-file tools."""
    arguments = create_model("args", path=(str, ...), limit=(int, 20))
    return ToolRegistry([Tool(f"tool-{n}", "Reads something the person keeps and returns "
                              "it as text.", arguments, lambda args, ctx: "")
                         for n in range(count)])


def system_prompt(chat: SkillRegistry, tools: ToolRegistry, catalogue: dict[str, str]) -> str:
    """The chat skill's system prompt for a terminal message."""
    settings = ChatSettings()
    ctx = SkillContext(event=chat_message("hi", "cli", "local"),
                       config={"buffer": settings.buffer, "allowed-buffers": [],
                               "history-chars": settings.history_chars},
                       tools=tools.descriptions(), skills_catalogue=catalogue)
    return chat.get("chat").probabilistic(ctx)["system"]


def per_skill(chat: SkillRegistry, catalogue: dict[str, str]) -> float:
    """Prompt tokens the catalogue adds, per skill (its header shared among them)."""
    tools = tool_registry(0)
    added = (estimate_tokens(system_prompt(chat, tools, catalogue))
             - estimate_tokens(system_prompt(chat, tools, {})))
    return added / len(catalogue)


def load_times(root: Path, repeat: int) -> list[float]:
    """Milliseconds per skill to load ROOT's SKILL.md skills, REPEAT times."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        docs = load_docs([root])
        times.append((time.perf_counter() - started) * 1000 / max(1, len(docs)))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer load repetitions")
    repeat = 5 if parser.parse_args().quick else 50
    with tempfile.TemporaryDirectory() as scratch:
        hy, generated = Path(scratch) / "hy", Path(scratch) / "generated"
        hy.mkdir()
        shutil.copy(REPO / "skills" / "chat.org", hy)
        chat = SkillRegistry([hy])
        chat.load()
        write_skills(generated, SKILLS)
        fixture = load_docs([FIXTURE]).catalogue()
        twenty = load_docs([generated]).catalogue()
        for label, catalogue in (("fixture skill", fixture), ("20 generated skills", twenty)):
            tokens = per_skill(chat, catalogue)
            verdict = "met" if tokens <= TARGET else "MISSED"
            print(f"catalogue, {label}: {tokens:.1f} tokens per skill "
                  f"(target <= {TARGET}: {verdict})")
        longest = {"a" * 64: "word " * 204 + "four"}   # the longest name and description
        print(f"catalogue, longest skill the spec allows: {per_skill(chat, longest):.1f} "
              "tokens per skill")
        loader = ToolRegistry([skill_load_tool(load_docs([FIXTURE]))]).descriptions()
        line = f"  - skill-load: {loader['skill-load']}"
        print(f"skill-load tool line (once, when any SKILL.md skill is installed): "
              f"{estimate_tokens(line)} tokens")
        for tools, skills in ((0, 0), (5, 1), (5, 20), (20, 20)):
            catalogue = dict(list(twenty.items())[:skills])
            prompt = system_prompt(chat, tool_registry(tools), catalogue)
            print(f"chat system prompt, {tools:2d} tools, {skills:2d} skills: "
                  f"{len(prompt)} chars, {estimate_tokens(prompt)} tokens")
        times = load_times(generated, repeat)
        print(f"load 20 SKILL.md skills: median {statistics.median(times):.2f} ms per skill "
              f"over {repeat} loads")


if __name__ == "__main__":
    main()
