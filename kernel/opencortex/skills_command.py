"""`opencortex skills`: the loaded skills, SKILL.md skills and tools (printing only)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from opencortex.clireport import EXIT_FAILED, EXIT_OK, print_json
from opencortex.config import load_config


def _skill_rows(registry: Any) -> list[dict[str, Any]]:
    return [{"name": s.name, "priority": s.priority, "description": s.description,
             "phases": [p for p in ("trigger", "probabilistic", "deterministic")
                        if getattr(s, p) is not None],
             "source": f"{s.source}:{s.line}" if s.source else None}
            for s in registry.skills]


def _tool_rows(registry: Any) -> list[dict[str, Any]]:
    tools = registry.tool_registry
    return [{"name": t.name, "risk": t.risk, "group": tools.group_of(t.name),
             "call": t.signature(), "description": t.description,
             "source": f"{t.source}:{t.line}" if t.source else None}
            for t in tools.all()]


def run_skills_command(args: argparse.Namespace) -> int:
    """List skills and tools; with --check, fail when a file is broken."""
    from opencortex.runtime import load_skills
    registry = load_skills(load_config(args.home))
    skills, tools = _skill_rows(registry), _tool_rows(registry)
    documents = [{"name": name, "description": description}
                 for name, description in registry.docs.catalogue().items()]
    errors = [str(e) for e in registry.errors]
    if args.json:
        print_json({"skills": skills, "skill_md": documents, "tools": tools,
                    "errors": errors})
    else:
        for row in skills:
            print(f"{row['name']:<20} priority {row['priority']:<4} "
                  f"{'+'.join(row['phases']):<36} {row['source']}")
        for row in documents:
            print(f"{row['name']:<20} SKILL.md")
        for row in tools:
            print(f"tool {row['name']:<24} {row['risk']:<10} {row['group']:<10} "
                  f"{row['source'] or ''}")
        for error in errors:
            print(f"BROKEN {error}", file=sys.stderr)
    return EXIT_FAILED if args.check and errors else EXIT_OK
