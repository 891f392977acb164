"""The two ways a credential is refused: not who it claims to be, or not allowed to."""

from __future__ import annotations

from typing import Literal

from snoozeml.errors import SnoozeError

Reason = Literal["missing", "invalid", "expired"]


class Unauthenticated(SnoozeError):
    """No credential was given ("missing"), it matches nothing or fails a check ("invalid"),
    or a token's `exp` has passed ("expired"). The message is "<reason> credentials", no more."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(f"{reason} credentials")
        self.reason: Reason = reason


class PermissionDenied(SnoozeError):
    """The credential is genuine but its role is below the operation's (or it grants none).
    `principal` is the key's name or the token's subject ("" when the token has none)."""

    def __init__(self, message: str, principal: str) -> None:
        super().__init__(message)
        self.principal = principal
