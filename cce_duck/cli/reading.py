"""``cce context``, ``cce search``, ``cce stats`` and ``cce sessions``: read commands (through the
server that owns the folder when one runs)."""

from __future__ import annotations

from typing import Annotated

import typer

from cce_duck.cli.common import DataDir, JsonOpt, app
from cce_duck.cli.output import Format, print_frame, print_json, print_record, say
from cce_duck.cli.remote import reader
from cce_duck.config import Config

__all__ = ["STATS_COLUMNS", "context", "search", "sessions", "stats"]

_DEFAULTS = Config()

Session = Annotated[str, typer.Argument(help="Session id.", show_default=False)]
Since = Annotated[str | None, typer.Option(help="Only turns at or after this ISO-8601 time.")]
Until = Annotated[str | None, typer.Option(help="Only turns at or before this ISO-8601 time.")]
_CAP_DEFAULT = f"{_DEFAULTS.context_max_tokens} or CCE_MAX_TOKENS"
_TOP_K_DEFAULT = f"{_DEFAULTS.top_k} or CCE_TOP_K"
MaxTokens = Annotated[int | None, typer.Option("--max-tokens", "-m", show_default=_CAP_DEFAULT,
                                               help="Token cap of the context.")]

#: The columns ``cce stats`` shows without ``--wide``.
STATS_COLUMNS = ["session_id", "turns", "notes", "raw_tokens", "compression_ratio", "tokens_saved"]


@app.command()
def context(
    session: Session,
    question: Annotated[str, typer.Argument(help="The question about to be asked.", show_default=False)],
    max_tokens: MaxTokens = None,
    top_k: Annotated[int | None, typer.Option(
        "--top-k", show_default=_TOP_K_DEFAULT, help="Notes retrieved.")] = None,
    since: Since = None,
    until: Until = None,
    last_turns: Annotated[int | None, typer.Option("--last-turns",
                                                   help="Only the session's last N turns.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Scores and budget split.")] = False,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Print the context a model would receive for a question."""
    with reader(data_dir) as r:
        p = r.context(session, question, max_tokens=max_tokens, top_k=top_k, since=since,
                      until=until, last_turns=last_turns, explain=explain)
    if as_json:
        print_json(p.to_dict())
        return
    say(p.to_string())
    say(f"{p.tokens} tokens (full history {p.full_tokens})", "dim")
    if explain and p.explain:
        print_json(p.explain)


@app.command()
def search(
    session: Session,
    query: Annotated[str, typer.Argument(help="What to look for.", show_default=False)],
    k: Annotated[int, typer.Option("--k", "-k", help="Turns returned.")] = 10,
    since: Since = None,
    until: Until = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Ranked stored turns for a query, with their scores (the ranking contexts are built from)."""
    with reader(data_dir) as r:
        hits = r.search(session, query, k, since=since, until=until)
    if as_json:
        print_frame(hits, Format.json)
        return
    shown = [c for c in ("rank", "turn_no", "role", "ts", "fused", "content") if c in hits.columns]
    print_frame(hits.select(shown), title=f"{query} in {session}", wide=["content"])


@app.command()
def stats(
    session: Annotated[str | None, typer.Argument(help="Session id.", show_default="all sessions")
                       ] = None,
    wide: Annotated[bool, typer.Option("--wide", "-w", help="Every column, not only the main ones.")
                    ] = False,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Sizes, tiers and compression of sessions (one session as a list of figures)."""
    with reader(data_dir) as r:
        df = r.stats(session)
    if as_json:
        print_frame(df, Format.json)
    elif session is not None and df.height == 1:
        print_record(df.to_dicts()[0], title=f"stats of {session}")
    else:
        print_frame(df if wide else df.select([c for c in STATS_COLUMNS if c in df.columns]),
                    title="cce_stats")


@app.command()
def sessions(
    user: Annotated[str | None, typer.Option(
        "--user", "-u", help="Only this user's sessions, in time order.", show_default=False)
                    ] = None,
    as_json: JsonOpt = False, data_dir: DataDir = None,
) -> None:
    """List sessions (or a user's)."""
    with reader(data_dir) as r:
        df = r.sessions(user)
    print_frame(df, Format.json if as_json else Format.table,
                title="sessions" if user is None else f"sessions of {user}")

