"""The Flask portal: app factory, one blueprint per area, REST API under /api/v1."""

from app.factory import create_app

__all__ = ["create_app"]
