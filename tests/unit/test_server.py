"""Auth off is said at every start, louder when the daemon listens beyond loopback."""

from __future__ import annotations

import logging

import pytest

from snoozeml.auth.authenticator import Authenticator
from snoozeml.server import _warn_if_open


@pytest.mark.parametrize(("host", "level"), [
    ("127.0.0.1", logging.WARNING),
    ("::1", logging.WARNING),
    ("localhost", logging.WARNING),
    ("0.0.0.0", logging.ERROR),
    ("::", logging.ERROR),
    ("10.1.2.3", logging.ERROR),
    ("inference.internal", logging.ERROR),
])
def test_auth_off_is_a_warning_on_loopback_and_an_error_beyond(
    caplog: pytest.LogCaptureFixture, host: str, level: int
) -> None:
    with caplog.at_level(logging.INFO, logger="snoozeml"):
        _warn_if_open(Authenticator.from_config(None, {}), host)
    (record,) = [r for r in caplog.records if "auth_disabled" in r.getMessage()]
    assert record.levelno == level


def test_auth_on_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    from snoozeml.config.auth import ApiKeyConfig, AuthConfig

    auth = Authenticator.from_config(AuthConfig(api_keys=[ApiKeyConfig(
        name="k", role="admin", sha256="0" * 64)]), {})
    with caplog.at_level(logging.INFO, logger="snoozeml"):
        _warn_if_open(auth, "0.0.0.0")
    assert not [r for r in caplog.records if "auth_disabled" in r.getMessage()]
