"""Read commands through the server that owns a data folder.

DuckDB lets one process write a file and no other process read it meanwhile, so while
``cce serve rest`` (or ``ui``) runs, ``cce stats``, ``context``, ``inspect``, ``search`` and
``sql`` ask that server (announced in the folder's ``server.json``) instead of opening the file.
:func:`reader` hands a command either the local :class:`~cce_duck.engine.Engine` or a
:class:`RemoteReader` with the same read methods.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import polars as pl

from cce_duck.cli.common import _engine, folder_of
from cce_duck.cli.output import say
from cce_duck.errors import CCEError, FolderInUseError, NotFoundError
from cce_duck.messages import validate_session_id, validate_user_id
from cce_duck.payload import ContextPayload, VerbatimTurn

__all__ = ["Reader", "RemoteReader", "ServerClient", "payload_from_dict", "reader", "server_of"]


class Reader(Protocol):
    """The read methods the CLI's read commands use (``Engine`` has them all)."""

    def sessions(self, user_id: str | None = None) -> pl.DataFrame: ...

    def stats(self, session_id: str | None = None) -> pl.DataFrame: ...

    def overview(self, session_id: str) -> pl.DataFrame: ...

    def context(self, session_id: str, query: str, *, max_tokens: int | None = None,
                top_k: int | None = None, since: datetime | str | None = None,
                until: datetime | str | None = None, last_turns: int | None = None,
                explain: bool = False) -> ContextPayload: ...

    def search(self, session_id: str, query: str, k: int = 10, *,
               since: datetime | str | None = None, until: datetime | str | None = None,
               last_turns: int | None = None) -> pl.DataFrame: ...


class ServerClient:
    """JSON over HTTP to a cce_duck server; its error bodies become :class:`CCEError`."""

    def __init__(self, url: str, key: str | None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = url.rstrip("/")
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request; a non-200 answer raises with the server's message."""
        import httpx

        try:
            r = self.client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise CCEError(f"the server at {self.url} did not answer: {exc}") from None
        try:
            data = r.json()
        except ValueError:
            raise CCEError(f"the server answered {r.status_code}: {r.text[:200]}") from None
        if r.status_code != 200:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            message = str(err.get("message") or r.text[:200])
            raise (NotFoundError if r.status_code == 404 else CCEError)(message)
        return data

    def sql(self, query: str) -> pl.DataFrame:
        """A read-only statement through ``/v1/admin/sql`` (needs an admin key)."""
        body = self.call("POST", "/v1/admin/sql", {"sql": query})
        cols: list[str] = body["columns"]
        return pl.DataFrame([dict(zip(cols, row, strict=True)) for row in body["rows"]],
                            schema=cols if not body["rows"] else None, strict=False)


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows, strict=False, infer_schema_length=None)


def _body(**fields: Any) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in fields.items()
            if v is not None}


def payload_from_dict(d: dict[str, Any]) -> ContextPayload:
    """A :class:`ContextPayload` from its ``to_dict()`` form (as the REST API returns it)."""
    turn_fields = {f.name for f in dataclasses.fields(VerbatimTurn)}
    turns = [VerbatimTurn(**{**{k: v for k, v in t.items() if k in turn_fields},
                             "ts": datetime.fromisoformat(t["ts"])}) for t in d.get("turns", [])]
    names = {f.name for f in dataclasses.fields(ContextPayload)} - {"turns"}
    return ContextPayload(turns=turns, **{k: v for k, v in d.items() if k in names})


class RemoteReader:
    """The read methods over a running server's REST API."""

    def __init__(self, url: str, key: str | None) -> None:
        self.server = ServerClient(url, key)

    def sessions(self, user_id: str | None = None) -> pl.DataFrame:
        """``GET /v1/sessions`` (``?user_id=``: the user's, in time order)."""
        query = "" if user_id is None else f"?user_id={validate_user_id(user_id)}"
        return _frame(self.server.call("GET", "/v1/sessions" + query)["sessions"])

    def stats(self, session_id: str | None = None) -> pl.DataFrame:
        """``GET /v1/sessions/{id}/stats`` for one session, or for every listed one."""
        ids = [session_id] if session_id is not None else [
            str(r["session_id"]) for r in self.server.call("GET", "/v1/sessions")["sessions"]]
        return _frame([self.server.call("GET", f"/v1/sessions/{validate_session_id(s)}/stats")
                       for s in ids])

    def overview(self, session_id: str) -> pl.DataFrame:
        """The ``cce_overview`` macro through the admin SQL route."""
        sid = validate_session_id(session_id)  # quotes cannot occur in a valid id
        df = self.server.sql(f"SELECT * FROM cce_overview('{sid}')")
        if df.is_empty() and self.stats(sid).get_column("session_id").len() == 0:
            raise NotFoundError(f"unknown session {sid!r}")
        return df

    def context(self, session_id: str, query: str, *, max_tokens: int | None = None,
                top_k: int | None = None, since: datetime | str | None = None,
                until: datetime | str | None = None, last_turns: int | None = None,
                explain: bool = False) -> ContextPayload:
        """``POST /v1/sessions/{id}/context``."""
        body = _body(query=query, max_tokens=max_tokens, top_k=top_k, since=since, until=until,
                     last_turns=last_turns, explain=explain or None)
        sid = validate_session_id(session_id)
        return payload_from_dict(self.server.call("POST", f"/v1/sessions/{sid}/context", body))

    def search(self, session_id: str, query: str, k: int = 10, *,
               since: datetime | str | None = None, until: datetime | str | None = None,
               last_turns: int | None = None) -> pl.DataFrame:
        """``POST /v1/sessions/{id}/search``; a server without that route answers through the
        ``cce_retrieve`` macro (the same ranking) on its admin SQL route."""
        sid = validate_session_id(session_id)
        body = _body(query=query, k=k, since=since, until=until, last_turns=last_turns)
        try:
            data = self.server.call("POST", f"/v1/sessions/{sid}/search", body)
        except NotFoundError as exc:
            if str(exc) != "Not Found":  # an unknown session, not a missing route
                raise
            return self._search_sql(sid, body)
        rows: list[dict[str, Any]] = (data.get("hits") or data.get("results") or []
                                      if isinstance(data, dict) else data)
        return _frame(rows)

    def _search_sql(self, sid: str, body: dict[str, Any]) -> pl.DataFrame:
        self.stats(sid)  # an unknown session is a NotFoundError, as from the library
        args = ", ".join([_literal(sid), _literal(body["query"]), f"k := {int(body['k'])}",
                          *(f"{n} := {_literal(body[n])}" for n in ("since", "until") if n in body),
                          *(f"last_turns := {int(body['last_turns'])}" for _ in [0]
                            if "last_turns" in body)])
        return self.server.sql(
            f"SELECT r.*, t.content FROM cce_retrieve({args}) AS r JOIN turns AS t "
            f"ON t.session_id = {_literal(sid)} AND t.turn_no = r.turn_no ORDER BY r.rank")


def _literal(value: object) -> str:
    """A SQL string literal (quotes doubled)."""
    return "'" + str(value).replace("'", "''") + "'"


def server_of(folder: Path) -> dict[str, Any] | None:
    """The server announced in ``folder`` (``{"url", "pid"}``), if any."""
    try:
        from cce_duck.server.run import running_server
    except ImportError:  # without the server extra no server can be running
        return None
    return running_server(folder)


def _through(folder: Path, info: dict[str, Any], exc: Exception) -> None:
    say(f"{folder} is owned by the server at {info['url']} (PID {info.get('pid')}); "
        "reading through it", "yellow", err=True)
    say(f"({exc})", "dim", err=True)


@contextmanager
def reader(data_dir: Path | None, read_only: bool = False) -> Iterator[Reader]:
    """The local engine, or the server that owns the folder when one announced itself."""
    try:
        eng = _engine(data_dir, read_only=read_only)
    except FolderInUseError as exc:
        folder = folder_of(data_dir)
        info = server_of(folder)
        if info is None:
            raise
        _through(folder, info, exc)
        yield RemoteReader(str(info["url"]), os.environ.get("CCE_API_KEY"))
        return
    with eng:
        yield eng

