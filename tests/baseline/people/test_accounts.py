"""Password hashing at the portal's real cost (the other tests hash cheaply: tests/conftest.py)."""

from __future__ import annotations

import argon2
import pytest

from baseline.context import Context
from baseline.models import Role
from baseline.people import accounts

pytestmark = pytest.mark.real_password_hashing


def test_passwords_are_stored_as_argon2id_at_rfc_9106_low_memory_cost(ctx: Context) -> None:
    with ctx.session() as session:
        user = accounts.create_user(
            session, "real@test.example", "Real", "a long passphrase", Role.PARTICIPANT
        )
        stored = user.password_hash
        assert accounts.authenticate(session, "real@test.example", "a long passphrase") == user
        assert accounts.authenticate(session, "real@test.example", "a wrong passphrase") is None
    assert "a long passphrase" not in stored
    parameters = argon2.extract_parameters(stored)
    wanted = argon2.profiles.RFC_9106_LOW_MEMORY
    assert parameters.type is argon2.Type.ID
    assert parameters.time_cost >= wanted.time_cost
    assert parameters.memory_cost >= wanted.memory_cost
