"""Hy skills: `defskill`, loading `.org`/`.hy` files, and the registry.

From Hy: `(import opencortex.skills [reject needs-approval])`.
"""

from opencortex.skills.loader import SkillError, load_module, org_code_blocks, skills_in
from opencortex.skills.registry import SkillRegistry
from opencortex.skills.skill import (
    DefskillError, NeedsApproval, Rejection, Skill, SkillContext, define_skill, needs_approval, reject)

__all__ = [
    "DefskillError", "NeedsApproval", "Rejection", "Skill", "SkillContext", "SkillError", "SkillRegistry",
    "define_skill", "load_module", "needs_approval", "org_code_blocks", "reject",
    "skills_in",
]
