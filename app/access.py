"""Who may reach what.

Every view is wrapped by `requires(...)`, which records the roles on the view function so that the
access-control test matrix can check every route against every role. Object-level rules (a
participant sees only their own attempts) live in the domain queries the views call.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from flask import abort, g, request

from baseline.models import Role, User

F = TypeVar("F", bound=Callable[..., Any])

PUBLIC = "public"
ANY_USER = frozenset(Role)
STAFF = frozenset({Role.ADMIN, Role.COORDINATOR})


def current_user() -> User | None:
    return cast(User | None, g.get("user"))


def requires(*roles: Role | str) -> Callable[[F], F]:
    """Allow the view to the given roles only (admins always); `requires(PUBLIC)` for everyone."""
    allowed: frozenset[Role | str] = frozenset(roles) | {Role.ADMIN}

    def decorate(view: F) -> F:
        @wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if PUBLIC not in allowed:
                user = current_user()
                if user is None:
                    abort(401)
                if user.role not in allowed:
                    abort(403)
            return view(*args, **kwargs)

        wrapper.allowed_roles = allowed  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate


def wants_json() -> bool:
    return request.path.startswith("/api/")
