"""LLM-backed context-engineering tools: PPA compression and OKF bundles, the macro-fallacy
consistency check, U-shaped chat compaction, file-backed notes and the ACE playbook.

Each tool takes a :class:`cce_duck.llm.LLM`; see the README section "LLM-backed context
engineering".
"""

from __future__ import annotations

from cce_duck.tools.check import CheckResult, ppa_check
from cce_duck.tools.compaction import CompactionResult, compact_messages
from cce_duck.tools.evolver import Evolver, EvolveReport
from cce_duck.tools.notes import Note, NotesManager
from cce_duck.tools.okf import Bundle, Concept, read_bundle, write_bundle
from cce_duck.tools.playbook import Bullet, Playbook
from cce_duck.tools.ppa import PPAResult, ppa_compress
from cce_duck.tools.ppa_okf import materialise_leaf, ppa_compress_to_okf

__all__ = [
    "Bullet",
    "Bundle",
    "CheckResult",
    "CompactionResult",
    "Concept",
    "EvolveReport",
    "Evolver",
    "Note",
    "NotesManager",
    "PPAResult",
    "Playbook",
    "compact_messages",
    "materialise_leaf",
    "ppa_check",
    "ppa_compress",
    "ppa_compress_to_okf",
    "read_bundle",
    "write_bundle",
]
