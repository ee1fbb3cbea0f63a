"""Domain errors. Each carries a message fit to show a user as it is (CLI line, HTTP 4xx body)."""

from __future__ import annotations


class DomainError(Exception):
    """Base of every error the domain raises on purpose; the portal maps it to a 4xx."""

    status_code = 400
    code = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class Forbidden(DomainError):
    status_code = 403
    code = "forbidden"


class InvalidInput(DomainError):
    status_code = 422
    code = "invalid_input"
