"""What a key limited to users reaches: the sessions bound to its users, looked up in the store.

A key's session patterns are checked by name alone; its ``user:`` patterns need the user a
session is bound to, which only the store knows. The checks answer 403 the same way whether
the session or user exists or not, and a write through such a key always names the user it
binds, so the library refuses a session bound meanwhile to someone else (409) in the same call.
"""

from __future__ import annotations

from cce_duck.engine import Engine
from cce_duck.messages import validate_user_id
from cce_duck.server.http import Guard
from cce_duck.server.keys import ForbiddenError, Principal

__all__ = ["check_answering_session", "check_session", "owner", "writing_user"]


def _owner(engine: Engine, sid: str) -> tuple[bool, str | None]:
    user = engine.writer.user_of(sid)
    return engine.writer.next_turn(sid) > 0, user


def owner(g: Guard, sid: str) -> tuple[bool, str | None]:
    """Whether ``sid`` is stored (or journaled), and the user it is bound to."""
    return g.call(_owner, g.engine, sid)


def check_session(who: Principal, g: Guard, sid: str) -> None:
    """403 unless the key reaches ``sid`` by name or through the user it is bound to (a session
    that is not stored, or has no user, is out of reach of a key limited to users)."""
    if who.allows(sid):
        return
    if not who.user_patterns:
        who.check(sid)
    who.check(sid, owner(g, sid)[1])


def check_answering_session(who: Principal, g: Guard, user_id: str, sid: str | None) -> None:
    """The session a user context is answered in: a new chat (not stored yet) or one the key
    reaches; a stored session outside the key is 403 (an admin key gets the library's 409)."""
    if sid is None or who.allows(sid):
        return
    exists, bound = owner(g, sid)
    if exists:
        who.check(sid, bound)


def writing_user(who: Principal, g: Guard, sid: str, user_id: str | None) -> str | None:
    """The ``user_id`` a write to ``sid`` passes to the library. A key reaching ``sid`` by name
    passes the caller's; a key limited to users binds a new session to the caller's user (or the
    key's only user) and writes a stored session of its users under that session's user.
    Raises 403 for any other session or user, 400 for an invalid user id."""
    uid = None if user_id is None else validate_user_id(user_id)
    if who.allows(sid):
        return uid
    if not who.user_patterns:
        who.check(sid)
    exists, bound = owner(g, sid)
    if exists:
        who.check(sid, bound)
    if uid is None:
        uid = bound if exists else who.sole_user
    if uid is None:
        raise ForbiddenError(f"this key writes only sessions of its users: send the user_id "
                             f"session {sid!r} is to be bound to")
    who.check_user(uid)
    return uid
