"""REST API: the versioned blueprint the app factory registers (today only /api/v1)."""

from app.api.v1 import CSRF_EXEMPT, ERROR_SCHEMA, bp, install_openapi

__all__ = ["CSRF_EXEMPT", "ERROR_SCHEMA", "bp", "install_openapi"]
