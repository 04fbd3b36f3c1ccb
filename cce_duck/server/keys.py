"""API keys of the network adapters and the sessions each key may use.

``CCE_API_KEY=secret`` gives one key access to everything. ``CCE_API_KEYS`` limits keys to
sessions: ``"k1=user-1,user-2;k2=team-*;admin=*"`` (shell-style patterns), or to users:
``"k3=user:alice"`` reaches every session bound to the user ``alice`` (and her user routes),
nothing else; patterns of both kinds may be mixed. A key whose patterns include ``*`` is an
admin key (it may also use the read-only SQL endpoint). Without any key every request is
allowed, which the servers only accept on a loopback address.
"""

from __future__ import annotations

import fnmatch
import hmac
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from cce_duck.errors import ValidationError

__all__ = ["USER_PREFIX", "AuthError", "ForbiddenError", "KeyRing", "Principal", "is_loopback"]


class AuthError(Exception):
    """No key, or an unknown key (HTTP 401)."""


class ForbiddenError(Exception):
    """A valid key used outside its sessions or on an admin-only route (HTTP 403)."""


#: A key pattern of this prefix names users (``user:alice``, ``user:team-*``), not sessions.
USER_PREFIX = "user:"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the session patterns of their key (``("*",)`` for full access) and the
    user patterns (``user:`` entries, prefix removed)."""

    patterns: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        """Full access (the single ``CCE_API_KEY``, a ``*`` pattern, or no keys configured)."""
        return "*" in self.patterns

    @property
    def session_patterns(self) -> tuple[str, ...]:
        """Patterns of session ids the key reaches by name."""
        return tuple(p for p in self.patterns if not p.startswith(USER_PREFIX))

    @property
    def user_patterns(self) -> tuple[str, ...]:
        """Patterns of user ids whose sessions the key reaches."""
        return tuple(p[len(USER_PREFIX):] for p in self.patterns if p.startswith(USER_PREFIX))

    @property
    def sole_user(self) -> str | None:
        """The one user a key limited to exactly one literal user id names (else ``None``)."""
        users = self.user_patterns
        if len(users) == 1 and not any(c in users[0] for c in "*?["):
            return users[0]
        return None

    def allows_user(self, user_id: str) -> bool:
        """May this caller use the user ``user_id`` (its routes and sessions)?"""
        return self.is_admin or any(fnmatch.fnmatchcase(user_id, p) for p in self.user_patterns)

    def allows(self, session_id: str, user_id: str | None = None) -> bool:
        """May this caller use ``session_id``, bound to ``user_id`` (``None``: no user, or not
        stored)?"""
        return any(fnmatch.fnmatchcase(session_id, p) for p in self.session_patterns) or (
            user_id is not None and self.allows_user(user_id))

    def check(self, session_id: str, user_id: str | None = None) -> None:
        """Raise :class:`ForbiddenError` outside the key's sessions (whether they exist or not)."""
        if not self.allows(session_id, user_id):
            raise ForbiddenError(f"this key may not use session {session_id!r}")

    def check_user(self, user_id: str) -> None:
        """Raise :class:`ForbiddenError` outside the key's users (whether they exist or not)."""
        if not self.allows_user(user_id):
            raise ForbiddenError(f"this key may not use user {user_id!r}")

    def require_admin(self) -> None:
        """Raise :class:`ForbiddenError` unless the key is an admin key."""
        if not self.is_admin:
            raise ForbiddenError("this route needs an admin key (a key with the pattern '*')")


FULL = Principal(("*",))


@dataclass(frozen=True)
class KeyRing:
    """The configured keys; ``authenticate`` turns a presented key into a :class:`Principal`."""

    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        """True when at least one key is configured."""
        return bool(self.keys)

    @classmethod
    def parse(cls, single: str | None = None, scoped: str | None = None) -> KeyRing:
        """Build from ``CCE_API_KEY`` and ``CCE_API_KEYS`` style strings."""
        keys: dict[str, tuple[str, ...]] = {}
        if single:
            keys[single.strip()] = ("*",)
        for part in (scoped or "").split(";"):
            if not part.strip():
                continue
            key, sep, pats = part.partition("=")
            patterns = tuple(p.strip() for p in pats.split(",") if p.strip())
            if not sep or not key.strip() or not patterns or USER_PREFIX in patterns:
                raise ValidationError(
                    "CCE_API_KEYS must look like "
                    "'key1=session-a,session-b;key2=team-*;key3=user:alice;admin=*'")
            keys[key.strip()] = patterns
        return cls(keys)

    @classmethod
    def from_env(cls) -> KeyRing:
        """Keys from ``CCE_API_KEY`` and ``CCE_API_KEYS``."""
        return cls.parse(os.environ.get("CCE_API_KEY"), os.environ.get("CCE_API_KEYS"))

    def authenticate(self, presented: str | None) -> Principal:
        """The caller behind ``presented`` (401 :class:`AuthError` when it is missing or wrong)."""
        if not self.keys:
            return FULL
        if not presented:
            raise AuthError("missing API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'")
        for key, patterns in self.keys.items():
            if hmac.compare_digest(key.encode(), presented.encode()):
                return Principal(patterns)
        raise AuthError("invalid API key")

    def check_bind(self, host: str) -> None:
        """Refuse to serve on a non-loopback address without a key."""
        if not self.keys and not is_loopback(host):
            raise ValidationError(
                f"refusing to listen on {host} without an API key: set CCE_API_KEY or CCE_API_KEYS "
                "(or listen on 127.0.0.1)")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
