"""The ``cce`` command line: a thin layer that parses input, calls the library, prints."""

from __future__ import annotations

import json
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Annotated

import typer
from rich.panel import Panel
from rich.progress import track
from rich.text import Text

from cce_duck import __version__
from cce_duck.allocator import tune_owned_process
from cce_duck.cli.common import EmbedderOpt, app
from cce_duck.cli.output import console, plural, print_frame, say
from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.errors import NotFoundError

__all__ = ["app", "main"]

# Command modules register themselves on ``app`` when imported.
from cce_duck.cli import archive as _archive  # noqa: F401
from cce_duck.cli import dashboard as _dashboard  # noqa: F401
from cce_duck.cli import memory as _memory  # noqa: F401
from cce_duck.cli import reading as _reading  # noqa: F401
from cce_duck.cli import serve as _serve  # noqa: F401
from cce_duck.cli import shell as _shell  # noqa: F401
from cce_duck.cli import users as _users  # noqa: F401
from cce_duck.cli import writing as _writing  # noqa: F401


def _stored_turns(eng: Engine, session_id: str) -> int:
    """Turns already stored in the session (0 for a new one), so a kept demo folder is not
    filled twice."""
    try:
        return int(eng.stats(session_id).item(0, "turns"))
    except NotFoundError:
        return 0


@app.command()
def demo(
    data_dir: Annotated[Path | None, typer.Option(
        "--data-dir", "-d", show_default="a temporary folder, removed at the end",
        help="Folder to keep the demo's memory in.")] = None,
    embedder: EmbedderOpt = None,
    question: Annotated[str | None, typer.Option("--question", "-q", show_default="the sample's",
                                                 help="Ask this question instead.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-m", help="Token cap of the context.")] = 300,
) -> None:
    """Ingest the sample conversation live, then show the compressed memory and a context."""
    sample = json.loads((files("cce_duck.data") / "sample_conversation.json").read_text("utf-8"))
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="cce_demo_")
        data_dir = Path(tmp.name)
    try:
        cfg = Config.from_env(embedder=embedder).with_(data_dir=data_dir, hot_tier_max_turns=4)
        with Engine(cfg) as eng:
            sid = sample["session_id"]
            if _stored_turns(eng, sid) >= len(sample["messages"]):
                say(f"the sample is already in {data_dir}: showing it again", "dim")
            else:
                for m in track(sample["messages"], description="ingesting one message at a time",
                               console=console):
                    eng.add_messages(sid, [m])
            q = question or sample["question"]
            stats = eng.stats(sid).to_dicts()[0]
            payload = eng.context(sid, q, max_tokens=max_tokens)
            full = payload.full_tokens  # one definition of the history's size, header and footer
            folder = (f"data folder: {data_dir} (temporary: removed when the demo ends; "
                      "keep one with --data-dir DIR)" if tmp is not None else f"data folder: {data_dir}")
            console.print(Panel.fit(
                Text.assemble((str(sample["title"]), "bold"), "\n",
                              f"{plural(stats['turns'], 'message')}, {full} tokens of history; "
                              f"{plural(stats['notes'], 'topic note')} ({stats['note_tokens']} tokens), "
                              f"{plural(stats['hot_turns'] + stats['pending_turns'], 'recent turn')} "
                              f"kept verbatim\nembedder: {eng.embedder_name}; {folder}"),
                title=f"cce_duck {__version__} demo"))
            print_frame(eng.overview(sid).select("start_turn", "end_turn", "label", "summary"),
                        title="Topics (warm tier)", wide=["summary"])
            console.print(Text.assemble("\n", ("Question: ", "bold"), q))
            console.print(Panel(Text(payload.to_string()), title="Context the model receives"))
            console.print(Text.assemble(
                "context: ", (str(payload.tokens), "bold"),
                f" tokens (cap {max_tokens}) vs full history {full} tokens: "
                f"{100 * (1 - payload.tokens / max(full, 1)):.0f}% fewer"))
            if tmp is not None:
                say(f"{data_dir} is removed now; run 'cce demo --data-dir DIR' to keep the memory "
                    "and query it with 'cce stats', 'cce context' or 'cce sql'", "dim")
    finally:
        if tmp is not None:
            tmp.cleanup()


def main() -> None:
    """Entry point of the ``cce`` script (a process cce_duck owns: the allocator is tuned)."""
    tune_owned_process()
    app()
