"""``Engine``: the one entry point of the library (sessions, ingestion, context, inspection)."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from cce_duck import clock, deletion, erasure, export, pins
from cce_duck.allocator import tune_allocator
from cce_duck.changefeed import Changes
from cce_duck.coarse import Approx
from cce_duck.config import Config
from cce_duck.context import (
    ContextRequest,
    build_context,
    build_user_context,
    is_overview_question,
    retrieve,
    retrieve_user,
    search_schema,
    user_search_schema,
)
from cce_duck.coordinator import Coordinator
from cce_duck.errors import ConflictError, NotFoundError, StorageError, ValidationError
from cce_duck.explain import refine as refine_explain
from cce_duck.index import SessionIndex
from cce_duck.index_cache import IndexCache
from cce_duck.items import ItemStore, owns_items
from cce_duck.lake import reread_if
from cce_duck.management import ManagementMixin
from cce_duck.messages import (
    load_history,
    parse_messages,
    parse_time,
    validate_session_id,
    validate_user_id,
)
from cce_duck.messages import message_id as check_message_id
from cce_duck.payload import ContextPayload
from cce_duck.rows import content_hash
from cce_duck.sandbox import is_read_only
from cce_duck.store import Store
from cce_duck.summariser import model_of
from cce_duck.text import estimate_tokens
from cce_duck.topics import macro_summary
from cce_duck.upkeep import Upkeep
from cce_duck.window import Window
from cce_duck.writer import Writer

if TYPE_CHECKING:
    import duckdb
    import polars as pl

__all__ = ["IN_MEMORY_MAX_TURNS", "Engine", "Session"]

#: Sessions up to this many turns may have their contexts built on a server's event loop
#: (:meth:`Engine.context_in_memory`: a few milliseconds); a longer one's context runs on a
#: worker thread, where its larger array work releases the interpreter lock and the loop
#: keeps answering other requests.
IN_MEMORY_MAX_TURNS = 20_000


class Engine(ManagementMixin):
    """An open memory store.

    >>> eng = Engine(data_dir=None, embedder="hash")      # in memory
    >>> eng.add_message("demo", "user", "We picked DuckDB for storage.")
    0
    >>> eng.close()
    """

    def __init__(self, config: Config | None = None, *, read_only: bool = False,
                 **overrides: Any) -> None:
        if config is None:
            config = Config.from_env(**{k: v for k, v in overrides.items() if k != "data_dir"})
            if "data_dir" in overrides:
                dd = overrides["data_dir"]
                config = config.with_(data_dir=None if dd is None else Path(dd))
        elif overrides:
            config = config.with_(**overrides)
        self.config = config
        self._context_calls: list[dict[str, Any]] = []
        self._calls_queued = threading.Event()
        self._items: ItemStore | None = None
        self._closed = False
        if config.summariser == "llm" and not read_only:
            model_of(config)  # a missing model id is refused before the folder is touched
        if config.tune_allocator:
            tune_allocator()
        self.store = Store(config.data_dir, config.embedder, read_only=read_only,
                           encryption_key=config.encryption_key,
                           memory_mb=config.duckdb_memory_mb, lake=config.lake())
        self.index = IndexCache(config.index_cache_mb * 2**20, Approx.of(config, self.store))
        #: user -> (store generation, its sessions in time order), for user contexts
        self._user_sessions: dict[str, tuple[int, tuple[str, ...]]] = {}
        try:
            lake = self.store.lake
            if lake is not None and lake.shared:
                self.store.coordinator = Coordinator(lake.catalog, str(lake.data_path),
                                                     read_only=read_only)
                self.store.coordinator.on_changes = self._foreign
            erasure.finish(self.store)  # an erasure a crash interrupted, before the replay
            self.writer = Writer(self.store, config)
            self.writer.on_flush = self._flushed
            self._compacting = threading.Lock()
            #: Compaction of the lake on a timer (a lake written to, ``compact_files`` > 0).
            self.upkeep = Upkeep(self.compact, every_s=config.compact_check_s,
                                 max_files=config.compact_files,
                                 finish=lambda: erasure.finish_stale(self.store)) if (
                lake is not None and not read_only and config.compact_files) else None
        except BaseException:
            self.store.close()
            raise
        self._deferred = threading.local()  # see deferred_sync()
        atexit.register(self.close)

    # -- lifecycle ----------------------------------------------------------

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _foreign(self, changes: Changes) -> None:
        """Other processes committed ``changes``: drop what is cached of those sessions. (Run
        under the coordinator's lock, by a write or by a read: it must not wait for the write
        lock, which a write holds while it waits for the coordinator's.)"""
        before, after = self.store.bump_generation()
        if changes.everything:
            self.writer.forget_sessions(None)
        else:
            self.writer.forget_sessions(changes.sessions)
            self.index.advance(before, after, changes.sessions)

    def close(self) -> None:
        """Store what is journaled, checkpoint and close the file."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self.upkeep is not None:
            self.upkeep.close()
        try:
            if not self.store.read_only:
                self._flush_context_calls()
                self.writer.flush(counts=True)
        except StorageError:
            pass  # what could not be stored stays in the journal: the next open stores it
        finally:
            self.writer.close()
            self.index.close()  # (removes the spill files of large users' indexes)
            if self.store.coordinator is not None:
                self.store.coordinator.close()
            self.store.close()

    def flush(self) -> None:
        """Move journaled messages into the tables now (reads do this by themselves)."""
        self.writer.flush()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def embedder_name(self) -> str:
        """Name of the embedder this folder is pinned to."""
        return self.store.embedder.name

    # -- writing ------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """A handle bound to one session."""
        return Session(self, validate_session_id(session_id))

    def add_message(self, session_id: str, role: str, content: str,
                    timestamp: datetime | str | None = None, name: str | None = None, *,
                    message_id: str | None = None, user_id: str | None = None) -> int:
        """Append one message; returns its turn number.

        ``message_id`` is the client's id of the message: sending it again (a retry after an
        error or a lost reply) stores nothing and returns the same turn number. ``user_id``:
        see :meth:`add_messages`.
        """
        msg: dict[str, Any] = {"role": role, "content": content}
        if timestamp is not None:
            msg["timestamp"] = timestamp
        if name is not None:
            msg["name"] = name
        if message_id is not None:
            msg["id"] = check_message_id(message_id)
        return self.add_messages(session_id, [msg], user_id=user_id)[0]

    def add_messages(self, session_id: str, messages: Iterable[Any], *,
                     user_id: str | None = None) -> list[int]:
        """Append messages (all validated first: a bad one stores none); their turn numbers.

        A message may carry the client's id (key ``id`` or ``message_id``): one the session
        already has is not stored again and gets the first one's turn number. The call returns
        once the messages are journaled (and on disk, unless ``durability="os"``); if it raises,
        none of them was stored.

        ``user_id`` (the rule of session ids) binds a session to its user at its first write;
        a session bound to another user, or started without one, raises
        :class:`~cce_duck.errors.ConflictError`. Without ``user_id`` nothing is checked.
        """
        sid = validate_session_id(session_id)
        uid = None if user_id is None else validate_user_id(user_id)
        parsed = parse_messages(messages)
        if not parsed:
            self.writer.check_user(sid, uid)
            return []
        numbers, ticket = self.writer.add(sid, parsed, user_id=uid)
        self._durable(ticket)
        return numbers

    def _durable(self, ticket: int) -> None:
        pending = getattr(self._deferred, "ticket", None)
        if pending is None:
            self.writer.sync(ticket)
        else:
            self._deferred.ticket = max(pending, ticket)

    @contextmanager
    def deferred_sync(self) -> Iterator[None]:
        """Writes in this block are synced to disk when it ends, not inside each call.

        A server holds its engine lock only around the call and syncs after releasing it, so
        the journal syncs of concurrent requests are shared (group commit).
        """
        outer = getattr(self._deferred, "ticket", None)
        self._deferred.ticket = 0
        try:
            yield
            ticket = self._deferred.ticket
        finally:
            self._deferred.ticket = outer
        self._durable(ticket)

    @property
    def storage_error(self) -> StorageError | None:
        """The storage failure the store is in (``None`` while it works)."""
        return self.store.failure

    def check_storage(self) -> StorageError | None:
        """Retry a failing store now (reopen it, store what the journal holds); the failure
        that remains, ``None`` once it works again."""
        if self.store.failure is None or self.store.read_only:
            return self.store.failure
        try:
            self.writer.flush()
        except StorageError as exc:
            return exc
        return None

    def ingest(self, session_id: str, messages: Iterable[Any], *, compress: bool = True,
               progress: Callable[[int, int], None] | None = None,
               user_id: str | None = None) -> list[int]:
        """Store a whole history at once; idempotent.

        Messages that repeat the session's stored turns from its first turn on are skipped, so
        ingesting the same history twice stores it once; so are messages whose client id
        (``id`` / ``message_id``) the session already has. Everything older than the hot window
        is compressed into notes (``compress=False`` leaves it pending). Every message is
        validated before anything is stored, and all are journaled at once (a call that raises
        stored none of them); then ``progress(done, total)`` is called with the count of new
        messages handled so far (first with ``done=0``, last with ``done=total``). Returns the
        turn numbers of the messages not skipped by the prefix rule. ``user_id``: see
        :meth:`add_messages`.
        """
        sid = validate_session_id(session_id)
        uid = None if user_id is None else validate_user_id(user_id)
        parsed = parse_messages(messages)
        self.writer.flush()
        self.writer.check_user(sid, uid)
        stored = self.store.read(lambda: self.store.q("turn_hashes", {"sid": sid}).fetchall())
        skip = 0
        for (_, role, h), m in zip(stored, parsed, strict=False):
            if role != m.role or int(h) != content_hash(m.role, m.content):
                break
            skip += 1
        new = parsed[skip:]
        if not new:
            if progress is not None:
                progress(0, 0)
            return []
        if progress is not None:
            progress(0, len(new))
        out, ticket = self.writer.add(sid, new, progress=progress, user_id=uid)  # all, or none
        try:
            self.writer.flush(finish={sid} if compress else None)
        except StorageError:
            if self.writer.journal is None:
                raise
            # journaled: acknowledged, and stored by the next flush that succeeds
        self._durable(ticket)
        if progress is not None:
            progress(len(new), len(new))
        return out

    def ingest_file(self, session_id: str, source: str | Path | IO[str], *, compress: bool = True,
                    progress: Callable[[int, int], None] | None = None,
                    user_id: str | None = None) -> list[int]:
        """:meth:`ingest` a conversation file (a path or an open text stream such as stdin):
        JSON messages (a list, or ``{"messages": [...]}``) or a ``User:`` / ``Assistant:``
        transcript. A JSON syntax error names its line and column; nothing is stored then."""
        if isinstance(source, str | Path):
            try:
                text = Path(source).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValidationError(f"cannot read {source}: {exc}") from None
        else:
            text = source.read()
        return self.ingest(session_id, load_history(text), compress=compress, progress=progress,
                           user_id=user_id)

    def close_session(self, session_id: str) -> str:
        """Compress what is pending, write the cold-tier summary, mark the session closed."""
        sid = self._existing(session_id)
        self.writer.flush(finish={sid}, hot_too=True)
        notes = self.store.read(lambda: self.store.q("note_labels", {"sid": sid}).fetchall())
        labels, summaries = [n[0] for n in notes], [n[1] for n in notes]
        summary = macro_summary(labels, summaries)
        if self.writer.summariser is not None:  # a model call, before the write transaction
            summary = self.writer.summariser.summarise_session(sid, labels, summaries, summary)
        with self.store.transaction():
            self.store.q("upsert_summary", {"sid": sid, "summary": summary,
                                            "tokens": estimate_tokens(summary), "now": clock.now()})
            self.store.q("close_session", {"sid": sid, "now": clock.now()})
        self.writer.reopen(sid)
        return summary

    # -- reading ------------------------------------------------------------

    def _existing(self, session_id: str, *, counts: bool = True) -> str:
        sid = validate_session_id(session_id)
        self._store_pending(counts=counts)  # reads of notes see how often they were retrieved
        if self.store.read(lambda: self.store.q("session_row", {"sid": sid}).fetchone()) is None:
            raise NotFoundError(f"unknown session {sid!r}")
        return sid

    def _store_pending(self, *, counts: bool = False, derived: bool = True) -> None:
        """Before a read: store what is journaled (and with ``counts`` the retrieval counts;
        on a lake with ``derived`` the derived rows of acknowledged turns, for reads of the
        tables that hold them). Without the write lock when nothing waits, so reads do not
        queue behind writes."""
        if self.store.read_only:
            return
        w = self.writer
        if (w.pending_count() or self.store.failure is not None or (counts and w.counts_waiting())
                or (derived and w.backlog_count())):
            w.flush(counts=counts, derived=derived)

    def _request(self, sid: str, query: str, max_tokens: int | None, top_k: int | None,
                 since: datetime | str | None, until: datetime | str | None,
                 last_turns: int | None = None) -> ContextRequest:
        """A context request with the configured defaults."""
        return ContextRequest(
            session_id=sid, query=query,
            max_tokens=self.config.context_max_tokens if max_tokens is None else max_tokens,
            top_k=self.config.top_k if top_k is None else top_k,
            since=None if since is None else parse_time(since, "since"),
            until=None if until is None else parse_time(until, "until"),
            last_turns=last_turns,
        )

    def context(self, session_id: str, query: str, *, max_tokens: int | None = None,
                top_k: int | None = None, since: datetime | str | None = None,
                until: datetime | str | None = None, last_turns: int | None = None,
                explain: bool = False) -> ContextPayload:
        """The token-capped context a model should receive before answering ``query``."""
        sid = validate_session_id(session_id)
        coord = self.store.coordinator
        if coord is not None:
            coord.refresh()
        req = self._request(sid, query, max_tokens, top_k, since, until, last_turns)
        index = None if self.store.read_only else self._flush_for_context(
            sid, overview=is_overview_question(req.query))
        payload = self.store.read(lambda: build_context(
            self.store, self.config, req, explain=explain, cache=self.index, index=index))
        if coord is not None and coord.stale is not None:
            payload.stale = f"served from this process's cache: {coord.stale}"
        return self._served(payload, req)

    def context_in_memory(self, session_id: str, query: str, *, max_tokens: int | None = None,
                          top_k: int | None = None, since: datetime | str | None = None,
                          until: datetime | str | None = None, last_turns: int | None = None,
                          explain: bool = False, fresh: bool = False) -> ContextPayload | None:
        """:meth:`context`, when it can be built from memory alone, without waiting for
        anything: on a local file, or on a lake shared with other processes when the caller
        has just read the change feed (``fresh``: a refresh that began after the call arrived
        ended without error; see :meth:`Coordinator.refreshed
        <cce_duck.coordinator.Coordinator.refreshed>`); none of the session's messages waiting
        to be stored, its index cached and current, the query embedded in microseconds (an
        embedder that says it is ``cheap``), not an overview question (that one reads the
        tables), a session of at most :data:`IN_MEMORY_MAX_TURNS` turns. Else ``None``, having
        done nothing: call :meth:`context`. The same context :meth:`context` gives.

        A server answers these on its event loop: handing a call of a few milliseconds of
        Python to a thread costs more than the call (docs/concurrency.md)."""
        sid = validate_session_id(session_id)
        store = self.store
        coord = store.coordinator
        if (not self.may_answer_in_memory()
                or (coord is not None and (not fresh or coord.stale is not None))
                or (not store.read_only and self.writer.waiting(sid))):
            return None
        req = self._request(sid, query, max_tokens, top_k, since, until, last_turns)
        if is_overview_question(req.query):
            return None
        index = self.index.current(store, sid)  # (after the waiting check: a flush moves the
        if index is None or len(index.turn_no) > IN_MEMORY_MAX_TURNS:  # generation before it
            return None                                                  # empties its buffer)
        payload = build_context(store, self.config, req, explain=explain, index=index)
        return self._served(payload, req, background=True)

    def may_answer_in_memory(self) -> bool:
        """Whether :meth:`context_in_memory` may answer at all now: the query is embedded in
        microseconds (an embedder that says it is ``cheap``) and the store has not failed."""
        return bool(getattr(self.store.embedder, "cheap", False)) and self.store.failure is None

    def _served(self, payload: ContextPayload, req: ContextRequest, *,
                background: bool = False) -> ContextPayload:
        """A built context, its explanation refined, recorded for the stats and its notes
        counted as retrieved (``background``: a full batch of records is stored by another
        thread, not by the caller)."""
        refine_explain(payload, Window(req.since, req.until, req.last_turns))
        self._record_context(payload, background=background)
        if not self.store.read_only:
            self.writer.note_retrieved(req.session_id, [n["note_id"] for n in payload.notes])
        return payload

    def _flush_for_context(self, sid: str, *, overview: bool = False) -> SessionIndex | None:
        """Store what is journaled, unless the only messages waiting are this session's and
        storing them would only add them: then the session's index takes them in from memory
        (and is returned) and the tables get them with the next flush (by size, by time, any
        other read, close). An overview lists the topics the tables hold (``cce_overview``):
        it stores what waits first."""
        if not self.writer.pending_count() and self.store.failure is None:
            return None  # nothing waits: no lock taken
        unstored = None if overview else self.writer.unstored(sid)
        index = None if unstored is None else self.index.take_unstored(
            self.store, sid, unstored, hot_turns=self.config.hot_tier_max_turns,
            batch_turns=self.config.live_batch_turns, topics_to_write=self.writer.topics_to_write,
            plan_notes=lambda *a: self.writer.plan_notes(sid, *a))
        if index is None:
            self.writer.flush(derived=False)  # (the index holds a lake's derived rows already)
        return index

    def user_sessions(self, user_id: str) -> list[str]:
        """The user's sessions in time order (of their first turn); raises
        :class:`NotFoundError` for a user no session belongs to."""
        uid = validate_user_id(user_id)
        self._store_pending(derived=False)
        generation = self.store.generation
        memo = self._user_sessions.get(uid)
        if memo is not None and memo[0] == generation:  # no write since: the same order
            return list(memo[1])
        sessions = [str(r[0]) for r in self.store.read(
            lambda: self.store.q("user_sessions", {"uid": uid}).fetchall())]
        if not sessions:
            raise NotFoundError(f"unknown user {uid!r}")
        if len(self._user_sessions) >= 256:
            self._user_sessions.clear()
        self._user_sessions[uid] = (generation, tuple(sessions))
        return sessions

    def users(self) -> pl.DataFrame:
        """Every user with how many sessions and turns they have and their first and last turn's
        time."""
        self._store_pending(derived=False)
        return self.store.read(lambda: self.store.frame("users"))

    def export_user(self, user_id: str, path: str | Path, *, format: str = "json",
                    confined: bool = False) -> Path:
        """Write every session of the user to ``path``: one JSON file, or with
        ``format="parquet"`` a folder of session exports (one folder per session, each one
        :meth:`import_session` reads) with the user's store items in ``store_items.parquet``.
        Unknown user: :class:`NotFoundError`. ``confined``: as for :meth:`export_session`,
        ``path`` must lie inside :attr:`Config.export_dir`."""
        sessions = self._user_or_items(user_id)
        if confined:
            path = export.confined_path(self.config.export_dir, path)
        return self.store.read(
            lambda: export.export_user(self.store, user_id, sessions, path, format),
            consistent=True)

    def user_document(self, user_id: str) -> dict[str, Any]:
        """The JSON export of a user as a dict (what :meth:`export_user` writes), with the
        user's store items (``items``)."""
        sessions = self._user_or_items(user_id)
        return self.store.read(lambda: export.user_document(self.store, user_id, sessions),
                               consistent=True)

    def _user_or_items(self, user_id: str) -> list[str]:
        """:meth:`user_sessions`, or no sessions for a user who has only store items (namespace
        ``("users", user_id, ...)``); :class:`NotFoundError` for a user with neither."""
        try:
            return self.user_sessions(user_id)
        except NotFoundError:
            if not owns_items(self.store, pins.user_owner(validate_user_id(user_id))):
                raise
            return []

    def pin_user(self, user_id: str, text: str) -> int:
        """Keep ``text`` in every context of every session of the user (with the session's own
        pins, within the same quarter of the budget); returns the pin id."""
        self.user_sessions(user_id)  # an unknown user: NotFoundError
        return pins.add_pin(self.store, pins.user_owner(user_id), text, None)

    def user_pins(self, user_id: str) -> pl.DataFrame:
        """The user's pins: ``pin_id, text, turn, created_at, updated_at``."""
        self.user_sessions(user_id)
        return self.store.read(lambda: pins.list_pins(self.store, pins.user_owner(user_id)))

    def unpin_user(self, user_id: str, pin_id: int) -> None:
        """Remove a pin of the user."""
        self.user_sessions(user_id)
        pins.remove_pin(self.store, pins.user_owner(user_id), pin_id)

    def delete_user(self, user_id: str) -> dict[str, int]:
        """Delete every session of the user with everything stored about them (turns, vectors,
        postings, notes, pins, summaries), with the guarantee of forgetting: the journal and the
        file are rewritten so their text is in no file of the folder, finished at the next open
        after a kill. Returns rows removed per table (``sessions``: how many sessions). An
        unknown user raises :class:`NotFoundError` and changes nothing. The user's store items
        (namespace ``("users", user_id, ...)``, :attr:`items`) go too, also for a user who has
        only those."""
        sessions = self._user_or_items(user_id)
        owner = pins.user_owner(user_id)
        try:  # the user's pins and items go with the sessions (stored under the user's owner)
            return deletion.delete_sessions(self.store, [*sessions, owner])
        finally:
            for sid in sessions:
                self.writer.reopen(sid)
                self.writer.forget_stats(sid)

    def user_context(self, user_id: str, query: str, *, session_id: str | None = None,
                     max_tokens: int | None = None, top_k: int | None = None,
                     since: datetime | str | None = None, until: datetime | str | None = None,
                     explain: bool = False) -> ContextPayload:
        """The token-capped context for ``query`` across every session of the user.

        The turns of all the user's sessions are ranked as one conversation in time order
        (the ranking of :mod:`cce_duck.ranking`); each quote is shown under its date and
        session. ``session_id`` is the session being answered in: its pins and recent turns
        come first, verbatim, as in :meth:`context` (a session not stored yet has none; one
        that belongs to another user raises :class:`ConflictError`). ``explain`` adds the
        budget split and how many hits and quotes came from each session. Raises
        :class:`NotFoundError` for an unknown user.
        """
        sessions = self.user_sessions(user_id)
        sid = "" if session_id is None else validate_session_id(session_id)
        if sid:
            with self.store.write_lock:  # (the writer's view of the session)
                owner, started = self.writer.user_of(sid), self.writer.next_turn(sid)
            if sid not in sessions and (owner is not None or started):
                raise ConflictError(f"session {sid!r} does not belong to user {user_id!r}")
        req = self._request(sid, query, max_tokens, top_k, since, until)
        own = [str(t) for t in self.user_pins(user_id)["text"]] if sid not in sessions else []
        payload = self.store.read(lambda: build_user_context(
            self.store, self.config, req, sessions, cache=self.index, explain=explain,
            user_pins=own, user_id=user_id))
        if not self.store.read_only:
            for n in payload.notes:
                if n["note_id"] is not None:  # an overview lists sessions, not notes
                    self.writer.note_retrieved(n["session_id"], [n["note_id"]])
        return payload

    def user_overview(self, user_id: str, *, since: datetime | str | None = None,
                      until: datetime | str | None = None) -> pl.DataFrame:
        """What the user talked about: their sessions in time order with the cold-tier summary
        (closed sessions) and the topics, those with a turn inside ``since``..``until`` (the
        ``cce_user_overview`` macro). Unknown user: :class:`NotFoundError`."""
        uid = validate_user_id(user_id)
        self.user_sessions(uid)
        window = Window.parse(since, until, None)
        return self.store.read(lambda: self.store.connection.execute(
            "SELECT * FROM cce_user_overview(?, since := ?, until := ?)",
            [uid, window.since, window.until]).pl())

    def user_search(self, user_id: str, query: str, k: int = 10) -> pl.DataFrame:
        """Ranked turns of all the user's sessions for ``query`` (the ranking of
        :meth:`user_context`, best first) with their session, scores and text. Raises
        :class:`NotFoundError` for an unknown user."""
        sessions = self.user_sessions(user_id)
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query must be a non-empty string")
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ValidationError("k must be a positive integer")
        query = query.encode("utf-8", "replace").decode("utf-8")
        hits = self.store.read(lambda: retrieve_user(self.store, self.config, sessions, query,
                                                     k=k, cache=self.index))
        return _hits_frame(hits, user_search_schema())

    @property
    def items(self) -> ItemStore:
        """The folder's key-value items in namespaces (the long-term memory store that
        :class:`cce_duck.integrations.langgraph.CCEStore` adapts), ranked like turns."""
        if self._items is None:
            self._items = ItemStore(self.store, self.writer.lock)
        return self._items

    def search(self, session_id: str, query: str, k: int = 10, *,
               since: datetime | str | None = None, until: datetime | str | None = None,
               last_turns: int | None = None) -> pl.DataFrame:
        """Ranked turns for ``query`` with their scores and text (the ``cce_retrieve`` ranking),
        optionally only those at or after ``since``, at or before ``until`` (ISO 8601) or among
        the last ``last_turns`` turns."""
        sid = self._existing(session_id, counts=False)
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query must be a non-empty string")
        query = query.encode("utf-8", "replace").decode("utf-8")  # lone surrogates become '?'
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ValidationError("k must be a positive integer")
        window = Window.parse(since, until, last_turns)
        hits = self.store.read(lambda: retrieve(self.store, self.config, sid, query, k=k,
                                                cache=self.index, window=window))
        return _hits_frame(hits, search_schema())

    def sessions(self, user_id: str | None = None) -> pl.DataFrame:
        """Every session with its turn and note counts; with ``user_id`` only the user's, in
        time order (:meth:`user_sessions`; an unknown user raises :class:`NotFoundError`)."""
        import polars as pl  # (not with the module: see cce_duck.context.search_schema)

        order = None if user_id is None else pl.DataFrame(
            {"session_id": self.user_sessions(user_id)})
        self._store_pending()
        frame = self.store.read(lambda: self.store.frame("sessions"))
        if order is None:
            return frame
        return order.join(frame, on="session_id", how="left", maintain_order="left")

    def notes(self, session_id: str) -> pl.DataFrame:
        """A session's notes (warm tier), in conversation order, without vectors."""
        sid = self._existing(session_id)
        return self.store.read(lambda: self.store.frame("notes", {"sid": sid}))

    def turns(self, session_id: str) -> pl.DataFrame:
        """A session's turns with their tier (hot / pending / compressed)."""
        sid = self._existing(session_id)
        return self.store.read(lambda: self.store.connection.execute(
            "SELECT * FROM cce_turns(?, hot := ?)", [sid, self.config.hot_tier_max_turns]).pl())

    def history(self, session_id: str) -> list[dict[str, Any]]:
        """Every stored message of a session as ``{role, content, name, turn_no}``, oldest first
        (empty for an unknown session). A turn whose raw text was dropped after compression
        (``keep_raw_turns=False``) gives its one-line summary."""
        sid = validate_session_id(session_id)
        self._store_pending(derived=False)  # (turn rows only; no lock when nothing waits)
        def read() -> list[dict[str, Any]]:
            cur = self.store.q("session_history", {"sid": sid})
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

        return self.store.read(read)

    def latest_user_message(self, session_id: str) -> str | None:
        """Text of the session's latest user message (``None`` if it has none or is unknown)."""
        sid = validate_session_id(session_id)
        self._store_pending(derived=False)  # (turn rows only; no lock when nothing waits)
        row = self.store.read(lambda: self.store.q("latest_user_message", {"sid": sid}).fetchone())
        return None if row is None else str(row[0])

    def overview(self, session_id: str) -> pl.DataFrame:
        """Topics in conversation order (the ``cce_overview`` macro)."""
        sid = self._existing(session_id)
        return self.store.read(
            lambda: self.store.connection.execute("SELECT * FROM cce_overview(?)", [sid]).pl())

    def outline(self, session_id: str) -> dict[str, Any]:
        """A session's topics in conversation order (``start_turn, end_turn, label, summary``)
        and its cold-tier summary (``None`` while the session is open)."""
        sid = self._existing(session_id)
        topics = self.overview(sid).select("start_turn", "end_turn", "label", "summary")
        return {"session_id": sid, "summary": self.summary(sid), "topics": topics.to_dicts()}

    def stats(self, session_id: str | None = None) -> pl.DataFrame:
        """Sizes, tier occupancy and token savings per session (the ``cce_stats`` macro)."""
        if not self.store.read_only:
            self._store_pending()
            self._flush_context_calls()
        df = self.store.read(lambda: self.store.connection.execute(
            "SELECT * FROM cce_stats(hot := ?)", [self.config.hot_tier_max_turns]).pl())
        if session_id is not None:
            sid = self._existing(session_id)
            df = df.filter(df["session_id"] == sid)
        return df

    def summary(self, session_id: str) -> str | None:
        """The cold-tier summary of a closed session (``None`` while it is open)."""
        sid = self._existing(session_id, counts=False)
        row = self.store.read(lambda: self.store.q("summary", {"sid": sid}).fetchone())
        return None if row is None else str(row[0])

    def sql(self, query: str, params: list[Any] | None = None) -> pl.DataFrame:
        """Run any SQL on the store (UDFs and macros available) and return a frame. On a lake,
        a read-only statement whose data files a compaction deleted under it runs again
        (:func:`cce_duck.lake.reread_if`)."""
        def run(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
            if self.store.lake is None:
                return con.execute(query, params).pl()
            return reread_if(lambda: con.execute(query, params).pl(),
                             lambda: is_read_only(con, query))

        if self.store.read_only:
            return run(self.store.con)
        self._store_pending(counts=True)
        try:  # (holding the write lock: the statement may write, and never runs inside a
            with self.store.write_lock:  # background flush's open transaction)
                return run(self.store.con)
        finally:
            self.store.bump_generation()  # the statement may have written: cached indexes are stale


class Session:
    """Methods of :class:`Engine` bound to one session id."""

    def __init__(self, engine: Engine, session_id: str) -> None:
        self.engine = engine
        self.id = session_id

    def add(self, role: str, content: str, timestamp: datetime | str | None = None,
            name: str | None = None, *, message_id: str | None = None) -> int:
        """Append one message."""
        return self.engine.add_message(self.id, role, content, timestamp, name,
                                       message_id=message_id)

    def add_messages(self, messages: Iterable[Any]) -> list[int]:
        """Append messages."""
        return self.engine.add_messages(self.id, messages)

    def context(self, query: str, **kw: Any) -> ContextPayload:
        """See :meth:`Engine.context`."""
        return self.engine.context(self.id, query, **kw)

    def stats(self) -> pl.DataFrame:
        """See :meth:`Engine.stats`."""
        return self.engine.stats(self.id)

    def notes(self) -> pl.DataFrame:
        """See :meth:`Engine.notes`."""
        return self.engine.notes(self.id)

    def close(self) -> str:
        """See :meth:`Engine.close_session`."""
        return self.engine.close_session(self.id)


def _hits_frame(hits: list[dict[str, Any]], schema: dict[str, Any]) -> pl.DataFrame:
    """Search hits as a frame of ``schema`` (empty when there are none)."""
    import polars as pl

    return pl.DataFrame(hits, schema=schema, orient="row") if hits else pl.DataFrame(schema=schema)
