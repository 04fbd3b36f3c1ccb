"""Engine configuration: one dataclass, overridable by ``CCE_*`` environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cce_duck import ranking
from cce_duck.errors import ValidationError

if TYPE_CHECKING:
    from cce_duck.lake import Lake

__all__ = ["SUMMARISERS", "Config", "env_flag"]

_ENV: dict[str, str] = {
    "data_dir": "CCE_DATA_DIR",
    "embedder": "CCE_EMBEDDER",
    "hot_tier_max_turns": "CCE_HOT_TURNS",
    "live_batch_turns": "CCE_LIVE_BATCH_TURNS",
    "context_max_tokens": "CCE_MAX_TOKENS",
    "top_k": "CCE_TOP_K",
    "recent_turns": "CCE_RECENT_TURNS",
    "topic_threshold": "CCE_TOPIC_THRESHOLD",
    "min_topic_turns": "CCE_MIN_TOPIC_TURNS",
    "max_topic_turns": "CCE_MAX_TOPIC_TURNS",
    "topic_gap_minutes": "CCE_TOPIC_GAP_MINUTES",
    "keep_raw_turns": "CCE_KEEP_RAW_TURNS",
    "flush_every": "CCE_FLUSH_EVERY",
    "durability": "CCE_DURABILITY",
    "encryption_key": "CCE_ENCRYPTION_KEY",
    "recency_weight": "CCE_RECENCY_WEIGHT",
    "warm_tier_max_chunks": "CCE_WARM_TIER_MAX_CHUNKS",
    "index_cache_mb": "CCE_INDEX_CACHE_MB",
    "exact_user_turns": "CCE_EXACT_USER_TURNS",
    "approx_candidates": "CCE_APPROX_CANDIDATES",
    "approx_bm25_turns": "CCE_APPROX_BM25_TURNS",
    "approx_dims": "CCE_APPROX_DIMS",
    "approx_sample": "CCE_APPROX_SAMPLE",
    "duckdb_memory_mb": "CCE_DUCKDB_MEMORY_MB",
    "tune_allocator": "CCE_TUNE_ALLOCATOR",
    "summariser": "CCE_SUMMARISER",
    "summariser_model": "CCE_SUMMARISER_MODEL",
    "summariser_backend": "CCE_SUMMARISER_BACKEND",
    "summariser_api_base": "CCE_SUMMARISER_API_BASE",
    "summariser_max_tokens": "CCE_SUMMARISER_MAX_TOKENS",
    "summariser_input_tokens": "CCE_SUMMARISER_INPUT_TOKENS",
    "summariser_timeout_s": "CCE_SUMMARISER_TIMEOUT_S",
    "export_dir": "CCE_EXPORT_DIR",
    "catalog": "CCE_CATALOG",
    "data_path": "CCE_DATA_PATH",
    "derive_after_s": "CCE_DERIVE_AFTER_S",
    "compact_files": "CCE_COMPACT_FILES",
    "compact_check_s": "CCE_COMPACT_CHECK_S",
}

SUMMARISERS = ("extractive", "llm")


@dataclass(frozen=True)
class Config:
    """Settings of an :class:`~cce_duck.Engine`.

    Attributes:
        data_dir: Folder holding ``memory.duckdb``; ``None`` keeps everything in memory.
        embedder: ``auto``, ``onnx``, ``multilingual``, ``neural``, ``hash`` or a registered name.
        hot_tier_max_turns: Most recent turns kept verbatim in every context.
        live_batch_turns: Turns that leave the hot window are compressed this many at a time.
        context_max_tokens: Default hard cap of a built context.
        top_k: Most topic notes quoted per question.
        recent_turns: Newest turns always sent verbatim with a fact question (older hot and
            pending turns are quoted when relevant; an overview question gets them all).
        topic_threshold: Similarity under which a new topic starts (``None``: embedder default).
        min_topic_turns: A topic is never cut before it has this many turns.
        max_topic_turns: A topic is always cut when it reaches this many turns.
        topic_gap_minutes: A silence this long always starts a new topic.
        keep_raw_turns: Keep the verbatim text of compressed turns (needed for quotes).
        recency_weight: Weight of the recency boost added to the dense score (default: the
            ranking specification's, ``cce_duck.ranking``).
        sentence_min_tokens: Messages at least this long also get one vector per sentence.
        rrf_k: Constant of reciprocal-rank fusion (default: the ranking specification's).
        flush_every: Journaled messages are moved into the tables in batches of this size (and
            before every read), so one commit serves many messages.
        durability: When a journaled message counts as stored: ``fsync`` (default: on disk
            before the call returns, so an OS crash or power cut loses nothing acknowledged;
            concurrent calls share one ``fdatasync``) or ``os`` (written to the OS, which writes
            it back within seconds: a killed process still loses nothing, an OS crash may lose
            the last acknowledged messages). See ``docs/durability.md``.
        encryption_key: Passphrase of an encrypted data folder (``None``: plain). A new folder
            opened with one is encrypted; an existing plain folder refuses one (convert it with
            :func:`cce_duck.encryption.encrypt_folder`). Never shown in ``repr``.
        warm_tier_max_chunks: Most notes a session keeps; past it the least-retrieved
            neighbouring old notes merge into coarser ones (``None``: no cap).
        index_cache_mb: Memory for the in-process retrieval indexes of recently queried
            sessions (int8 vectors and postings); least recently used sessions are dropped.
        exact_user_turns: A user with more stored turns than this is ranked across their
            sessions with an approximate first stage (``docs/users.md``): compact codes of
            the vectors in memory, the exact int8 vectors in a spill file of the data folder
            (``vectors.tmp/``), read for the best ``approx_candidates`` turns only. At or
            below it, and for a session's own context, the ranking is exact.
        approx_candidates: Turns the approximate first stage scores exactly per question (those
            with the best estimate plus recency).
        approx_bm25_turns: Turns with the best BM25 scores the first stage also scores exactly
            (their dense rank counts in the fusion).
        approx_dims: Coordinates (one byte each) of a vector's code in the first stage.
        approx_sample: Vectors of the user the first stage's projection is fitted on.
        duckdb_memory_mb: DuckDB's buffer pool limit. The database file is the source of
            truth; a small pool keeps resident memory flat as memory grows.
        tune_allocator: Have the C allocator (glibc) map blocks of 64 KB and more on their own
            and keep at most two heaps, so that memory freed by DuckDB, Arrow and NumPy goes
            back to the system instead of fragmenting the heap (see :mod:`cce_duck.allocator`).
            Process-wide, so off for a library user unless asked for (``CCE_TUNE_ALLOCATOR=1``);
            the processes cce_duck owns (the ``cce`` command, its servers, ``cce-mcp``) tune
            at start unless ``CCE_TUNE_ALLOCATOR=0``.
        summariser: How topic notes (and the summary of a closed session) are summarised:
            ``extractive`` (default: the topic's most central message lines, no model) or
            ``llm`` (one model call per note through :class:`cce_duck.llm.LLM` and the store's
            ``llm_cache``; any failure keeps the extractive summary and warns with
            :class:`cce_duck.summariser.SummariserWarning`).
        summariser_model: Model id of the ``llm`` summariser (``None``: ``CCE_LLM_MODEL``).
        summariser_backend: ``litellm``, ``openai``, ``vllm`` or a backend object (``None``:
            ``CCE_LLM_BACKEND``, else ``litellm``).
        summariser_api_base: Address of an OpenAI-compatible server (``None``:
            ``OPENAI_API_BASE``).
        summariser_max_tokens: Cap of a note summary written by the model (the reply is limited
            to it and clipped to it), and never more than the note's own text.
        summariser_input_tokens: Most tokens of a topic's text one summary call sees (longer
            topics send every message cut to a fair share).
        summariser_timeout_s: Limit of one summary call (one retry, twice this in total).
        export_dir: The one folder in which an agent may have exports written (the MCP tool
            ``cce_export_session`` with a ``path``; relative paths are taken inside it).
            ``None`` (the default): that tool returns exports but writes no file.
        catalog: A DuckLake catalog instead of a data folder (``None``, the default: the data
            folder's DuckDB file): ``postgres:dbname=… host=… user=…`` for a lake many
            processes share, or the path of a local ``.ducklake`` file for one process.
            ``data_dir`` is ``None`` then. See ``docs/lake.md``.
        data_path: Folder of a lake's Parquet files (required with a PostgreSQL catalog; for a
            local catalog it defaults to ``<catalog>.files/``).
        derive_after_s: On a lake, a message is acknowledged once its turn row is committed;
            its vectors, postings and the notes that compress pending turns follow in a later
            commit, this many seconds after the oldest of them waits (or sooner when many
            wait, or before a read that needs them). See ``docs/scale.md``.
        compact_files: On a lake, a process that writes compacts the lake by itself (as
            ``cce compact`` does: merges small data files, drops deleted rows, expires older
            snapshots) once the current snapshot reads more than this many data files; one
            process at a time, a table per commit, writes waiting for one step at a time.
            0: never (run ``cce compact`` yourself). See ``docs/lake.md``.
        compact_check_s: How often (seconds) such a process counts the lake's data files.
    """

    data_dir: Path | None = field(default_factory=lambda: Path(".cce_data"))
    embedder: str = "auto"
    hot_tier_max_turns: int = 6
    live_batch_turns: int = 8
    context_max_tokens: int = 1000
    top_k: int = 32
    recent_turns: int = 2
    topic_threshold: float | None = None
    min_topic_turns: int = 2
    max_topic_turns: int = 12
    topic_gap_minutes: float = 240.0
    keep_raw_turns: bool = True
    recency_weight: float = field(default_factory=lambda: ranking.spec().recency_weight)
    sentence_min_tokens: int = 24
    rrf_k: int = field(default_factory=lambda: ranking.spec().rrf_k)
    flush_every: int = 256
    durability: str = "fsync"
    encryption_key: str | None = field(default=None, repr=False)
    warm_tier_max_chunks: int | None = None
    index_cache_mb: int = 64
    exact_user_turns: int = 50_000
    approx_candidates: int = 4_000
    approx_bm25_turns: int = 1_000
    approx_dims: int = 96
    approx_sample: int = 20_000
    duckdb_memory_mb: int = 32
    tune_allocator: bool = False
    summariser: str = "extractive"
    summariser_model: str | None = None
    summariser_backend: Any = None
    summariser_api_base: str | None = None
    summariser_max_tokens: int = 80
    summariser_input_tokens: int = 1024
    summariser_timeout_s: float = 30.0
    export_dir: Path | None = None
    catalog: str | None = field(default=None, repr=False)  # a PostgreSQL DSN may hold a password
    data_path: Path | None = None
    derive_after_s: float = 2.0
    compact_files: int = 1000
    compact_check_s: float = 60.0

    def __post_init__(self) -> None:
        """Reject settings that cannot work."""
        positive = ("hot_tier_max_turns", "live_batch_turns", "context_max_tokens", "top_k",
                    "recent_turns",
                    "min_topic_turns", "max_topic_turns", "sentence_min_tokens", "rrf_k",
                    "flush_every", "index_cache_mb", "exact_user_turns", "approx_candidates",
                    "approx_bm25_turns",
                    "approx_dims", "approx_sample", "duckdb_memory_mb", "summariser_max_tokens",
                    "summariser_input_tokens")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValidationError(f"config {name} must be a positive integer, got {value!r}")
        cap = self.warm_tier_max_chunks
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 2):
            raise ValidationError(f"config warm_tier_max_chunks must be an integer >= 2, got {cap!r}")
        if self.min_topic_turns > self.max_topic_turns:
            raise ValidationError("config min_topic_turns must not exceed max_topic_turns")
        if self.topic_threshold is not None and not -1.0 <= self.topic_threshold <= 1.0:
            raise ValidationError("config topic_threshold must be within [-1, 1]")
        if self.topic_gap_minutes <= 0:
            raise ValidationError("config topic_gap_minutes must be > 0")
        d = self.derive_after_s
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0 <= d < float("inf"):
            raise ValidationError(f"config derive_after_s must be a number >= 0, got {d!r}")
        n = self.compact_files
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValidationError(f"config compact_files must be an integer >= 0, got {n!r}")
        c = self.compact_check_s
        if isinstance(c, bool) or not isinstance(c, int | float) or not 0 < c < float("inf"):
            raise ValidationError(f"config compact_check_s must be a number > 0, got {c!r}")
        if self.encryption_key is not None and (
                not isinstance(self.encryption_key, str) or not self.encryption_key):
            raise ValidationError("config encryption_key must be a non-empty string or None")
        self._check_summariser()
        from cce_duck.journal import DURABILITY

        mode = self.durability
        if not isinstance(mode, str) or mode.strip().lower() not in DURABILITY:
            raise ValidationError(f"config durability must be one of {list(DURABILITY)}, got {mode!r}")
        object.__setattr__(self, "durability", mode.strip().lower())
        if self.catalog is not None:
            self.lake()  # a malformed catalog is refused here
            object.__setattr__(self, "data_dir", None)  # a lake store has no data folder
        if self.data_path is not None and self.catalog is None:
            raise ValidationError("config data_path is the folder of a lake's files: give "
                                  "catalog too (CCE_CATALOG), or use data_dir for a data folder")
        for name in ("data_dir", "export_dir", "data_path"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    def _check_summariser(self) -> None:
        mode = self.summariser
        if not isinstance(mode, str) or mode.strip().lower() not in SUMMARISERS:
            raise ValidationError(f"config summariser must be one of {list(SUMMARISERS)}, got {mode!r}")
        object.__setattr__(self, "summariser", mode.strip().lower())
        for name in ("summariser_model", "summariser_api_base"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValidationError(f"config {name} must be a non-empty string or None")
        backend = self.summariser_backend
        if isinstance(backend, str):
            from cce_duck.llm.backends import BACKENDS

            if backend.strip().lower() not in BACKENDS:
                raise ValidationError(f"config summariser_backend must be one of {sorted(BACKENDS)} "
                                      f"or a backend object, got {backend!r}")
        elif backend is not None and not callable(getattr(backend, "complete", None)):
            raise ValidationError("config summariser_backend must be a backend name or an object "
                                  "with .name and .complete()")
        t = self.summariser_timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
            raise ValidationError(f"config summariser_timeout_s must be > 0, got {t!r}")

    @classmethod
    def from_env(cls, **overrides: Any) -> Config:
        """Build a config from defaults, then ``CCE_*`` variables, then ``overrides``."""
        values: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for name, var in _ENV.items():
            raw = os.environ.get(var)
            if raw is None or raw == "":
                continue
            values[name] = _parse(name, str(types[name]), raw, var)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def lake(self) -> Lake | None:
        """The lake this config names (``None``: a data folder or in memory)."""
        if self.catalog is None:
            return None
        from cce_duck.lake import Lake

        return Lake.of(self.catalog, self.data_path)

    def with_(self, **changes: Any) -> Config:
        """A copy with some fields changed."""
        return replace(self, **changes)


def env_flag(var: str) -> bool | None:
    """A yes/no environment variable (``1 true yes on`` / ``0 false no off``); ``None`` when
    unset or empty. Any other value is a :class:`ValidationError`."""
    raw = os.environ.get(var)
    if raw is None or raw == "":
        return None
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ValidationError(f"environment variable {var}={raw!r} is not a yes/no value (1 or 0)")


def _parse(name: str, type_name: str, raw: str, var: str) -> Any:
    try:
        if "Path" in type_name:
            return Path(raw)
        if "bool" in type_name:
            flag = env_flag(var)
            if flag is None:
                raise ValueError(raw)
            return flag
        if "float" in type_name:
            return float(raw)
        if "int" in type_name:
            return int(raw)
    except ValueError:
        raise ValidationError(f"environment variable {var}={raw!r} is not a valid {name}") from None
    return raw
