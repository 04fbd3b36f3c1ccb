"""The tools' prompts, versioned: the version is part of every cache key, so editing a prompt
means bumping its version (old cached replies are then never reused)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PROMPTS", "Prompt", "prompt"]


@dataclass(frozen=True)
class Prompt:
    """A system message and a user template (``str.format`` fields)."""

    name: str
    version: int
    system: str
    user: str

    @property
    def key(self) -> str:
        """``name@vN``, passed to the model client as the prompt version."""
        return f"{self.name}@v{self.version}"

    def messages(self, **fields: Any) -> list[dict[str, str]]:
        """The chat for these field values."""
        return [{"role": "system", "content": self.system},
                {"role": "user", "content": self.user.format(**fields)}]


_ALL = [
    Prompt("ppa_leaf", 1,
           "You compress text. Keep names, numbers, dates, decisions and facts. "
           "Reply with the summary only.",
           "Summarise this passage in at most {words} words.\n\n<passage>\n{text}\n</passage>"),
    Prompt("ppa_merge", 1,
           "You merge partial summaries of one document into one summary. Keep names, numbers, "
           "dates, decisions and facts. Reply with the summary only.",
           "Merge these summaries, in order, into one summary of at most {words} words.\n\n"
           "{text}"),
    Prompt("ppa_estimate", 1,
           "You estimate quantities. Reply with a single number and nothing else.",
           "Question: {question}\nPopulation: {population}\nAnswer with one number."),
    Prompt("compact_summary", 1,
           "You summarise the middle of a conversation for a model that will continue it. "
           "Reply with a JSON object with the keys goal (string), decisions, facts and "
           "open_items (lists of short strings).",
           "Summarise this part of the conversation in at most {words} words in total.\n\n"
           "{text}"),
    Prompt("ace_generate", 1,
           "You answer questions. Use the playbook's bullets when they help. Reply with a JSON "
           "object: {{\"answer\": string, \"bullet_ids\": [ids of the bullets you used]}}.",
           "Playbook:\n{playbook}\n\nQuestion: {question}"),
    Prompt("ace_reflect", 1,
           "You diagnose answers. Reply with a JSON object: {{\"diagnosis\": string, "
           "\"key_insight\": string, \"helpful_ids\": [bullet ids], \"harmful_ids\": [bullet ids]}}.",
           "Playbook:\n{playbook}\n\nQuestion: {question}\nAnswer given: {answer}\n"
           "Correct: {correct}\nFeedback: {feedback}"),
    Prompt("ace_curate", 1,
           "You maintain a playbook of short, reusable strategy bullets. Reply with a JSON object "
           "{{\"operations\": [...]}} where each operation is one of "
           "{{\"op\": \"ADD\", \"section\": s, \"content\": c}}, "
           "{{\"op\": \"UPDATE\", \"id\": n, \"content\": c}}, "
           "{{\"op\": \"MERGE\", \"ids\": [n, ...], \"content\": c}}, "
           "{{\"op\": \"DELETE\", \"id\": n}}. Return an empty list when nothing should change.",
           "Playbook:\n{playbook}\n\nQuestion: {question}\nReflection: {reflection}\n"
           "Sections allowed: {sections}"),
    Prompt("note_summary", 1,
           "You write the memory notes of a conversation. Summarise one topic of it in plain "
           "sentences: who said or decided what, with names, numbers and dates kept. Reply with "
           "the summary only.",
           "Summarise this part of the conversation in at most {words} words.\n\n"
           "<conversation>\n{text}\n</conversation>"),
    Prompt("session_summary", 1,
           "You summarise a whole conversation from the summaries of its topics. Keep names, "
           "numbers, dates and decisions. Reply with the summary only.",
           "Summarise this conversation in at most {words} words. Its topics, in order:\n\n{text}"),
]

PROMPTS: dict[str, Prompt] = {p.name: p for p in _ALL}


def prompt(name: str) -> Prompt:
    """The current prompt called ``name``."""
    return PROMPTS[name]
