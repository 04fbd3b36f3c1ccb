"""The ``cce`` command line: a thin layer that parses input, calls the library, prints."""

from __future__ import annotations

import json
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.panel import Panel
from rich.progress import track

from cce_duck import __version__
from cce_duck.allocator import tune_owned_process
from cce_duck.cli.common import (
    DataDir,
    EmbedderOpt,
    JsonOpt,
    SummariserModelOpt,
    SummariserOpt,
    _engine,
    _fail,
    app,
)
from cce_duck.cli.output import Format, console, err_console, print_frame, print_json
from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.errors import CCEError
from cce_duck.messages import parse_transcript

__all__ = ["app", "main"]

# Command modules register themselves on ``app`` when imported.
from cce_duck.cli import archive as _archive  # noqa: F401
from cce_duck.cli import dashboard as _dashboard  # noqa: F401
from cce_duck.cli import memory as _memory  # noqa: F401
from cce_duck.cli import serve as _serve  # noqa: F401
from cce_duck.cli import shell as _shell  # noqa: F401


@app.command()
def demo(
    data_dir: Annotated[Path | None, typer.Option("--data-dir", "-d",
                                                  help="Folder to keep (default: a temporary one).")] = None,
    embedder: EmbedderOpt = None,
    question: Annotated[str | None, typer.Option("--question", "-q",
                                                 help="Ask this instead of the sample's question.")] = None,
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
            for m in track(sample["messages"], description="ingesting one message at a time",
                           console=console):
                eng.add_messages(sid, [m])
            q = question or sample["question"]
            stats = eng.stats(sid).to_dicts()[0]
            payload = eng.context(sid, q, max_tokens=max_tokens)
            console.print(Panel.fit(
                f"[bold]{sample['title']}[/bold]\n"
                f"{stats['turns']} messages, {stats['raw_tokens']} tokens of history; "
                f"{stats['notes']} topic notes ({stats['note_tokens']} tokens), "
                f"{stats['hot_turns'] + stats['pending_turns']} recent turns kept verbatim\n"
                f"embedder: {eng.embedder_name}; data folder: {data_dir}",
                title=f"cce_duck {__version__} demo"))
            print_frame(eng.overview(sid).select("start_turn", "end_turn", "label", "summary"),
                        title="Topics (warm tier)")
            console.print(f"\n[bold]Question:[/bold] {q}")
            console.print(Panel(payload.to_string(), title="Context the model receives"))
            full = payload.full_tokens
            console.print(
                f"context: [bold]{payload.tokens}[/bold] tokens (cap {max_tokens}) vs full history "
                f"{full} tokens: {100 * (1 - payload.tokens / max(full, 1)):.0f}% fewer")
    except CCEError as exc:
        raise _fail(exc) from None
    finally:
        if tmp is not None:
            tmp.cleanup()


@app.command()
def ingest(
    file: Annotated[Path, typer.Argument(help="JSON messages or a 'User:/Assistant:' transcript.")],
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.")],
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    embedder: EmbedderOpt = None,
    summariser: SummariserOpt = None,
    summariser_model: SummariserModelOpt = None,
) -> None:
    """Store a conversation in a session (re-ingesting the same history stores nothing twice)."""
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise _fail(exc) from None
    try:
        messages: Any
        try:
            data = json.loads(text)
            messages = data["messages"] if isinstance(data, dict) else data
        except json.JSONDecodeError:
            messages = parse_transcript(text)
        with _engine(data_dir, embedder, summariser=summariser,
                     summariser_model=summariser_model) as eng:
            chunk = 64
            added: list[int] = []
            items = list(messages) if isinstance(messages, list) else messages
            for i in track(range(0, len(items), chunk), description="ingesting",
                           console=err_console):
                added.extend(eng.ingest(session, items[: i + chunk], compress=i + chunk >= len(items)))
            stats = eng.stats(session).to_dicts()[0]
        if as_json:
            print_json({"session_id": session, "stored": len(added), "turns": stats["turns"],
                        "notes": stats["notes"]})
        else:
            console.print(f"stored {len(added)} new messages in {session!r}: {stats['turns']} "
                          f"turns, {stats['notes']} notes")
    except (CCEError, KeyError, TypeError) as exc:
        raise _fail(exc) from None


@app.command()
def context(
    session: Annotated[str, typer.Argument(help="Session id.")],
    question: Annotated[str, typer.Argument(help="The question about to be asked.")],
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", "-m", help="Token cap.")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Notes retrieved.")] = None,
    since: Annotated[str | None, typer.Option(help="ISO-8601 start of the time window.")] = None,
    until: Annotated[str | None, typer.Option(help="ISO-8601 end of the time window.")] = None,
    last_turns: Annotated[int | None, typer.Option("--last-turns",
                                                   help="Only the session's last N turns.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Scores and budget split.")] = False,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Print the context a model would receive for a question."""
    try:
        with _engine(data_dir) as eng:
            p = eng.context(session, question, max_tokens=max_tokens, top_k=top_k, since=since,
                            until=until, last_turns=last_turns, explain=explain)
    except CCEError as exc:
        raise _fail(exc) from None
    if as_json:
        print_json(p.to_dict())
        return
    console.print(p.to_string(), markup=False, highlight=False)
    console.print(f"[dim]{p.tokens} tokens (full history {p.full_tokens})[/dim]")
    if explain and p.explain:
        print_json(p.explain)


@app.command()
def stats(
    session: Annotated[str | None, typer.Argument(help="Session id (all when omitted).")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Sizes, tiers and compression of sessions."""
    try:
        with _engine(data_dir) as eng:
            df = eng.stats(session)
    except CCEError as exc:
        raise _fail(exc) from None
    print_frame(df, Format.json if as_json else Format.table, title="cce_stats")


@app.command()
def sessions(as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """List sessions."""
    try:
        with _engine(data_dir) as eng:
            df = eng.sessions()
    except CCEError as exc:
        raise _fail(exc) from None
    print_frame(df, Format.json if as_json else Format.table, title="sessions")


def main() -> None:
    """Entry point of the ``cce`` script (a process cce_duck owns: the allocator is tuned)."""
    tune_owned_process()
    app()
