"""`snooze keys new`, run as the real command: what it prints, pasted into a models.toml,
authenticates with the role asked for, and no secret reaches stderr. (`snooze token`:
test_token.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from snooze_command import authenticator, snooze, write

from snoozeml.auth.authenticator import PermissionDenied, Principal, Unauthenticated
from snoozeml.cli import exit_codes
from snoozeml.cli.main import main
from snoozeml.operations import Operation


def test_a_new_key_pasted_into_the_config_authenticates_with_its_role(tmp_path: Path) -> None:
    done = snooze("keys", "new", "--role", "inference", "--name", "ci", cwd=tmp_path)

    assert (done.returncode, done.stderr) == (0, "")
    key, *rest = done.stdout.splitlines()
    assert key.startswith("snz_")
    assert len(key) >= len("snz_") + 43  # 256 bits, base64url
    assert done.stdout.count(key) == 1  # shown once; the config keeps only its hash
    auth = authenticator(write(tmp_path, "[auth]\n" + "\n".join(rest) + "\n"), {})
    assert auth.check(Operation.INFER, f"Bearer {key}", None) == Principal(
        "ci", "inference", "api_key")
    with pytest.raises(PermissionDenied):
        auth.check(Operation.REPOSITORY_LOAD, None, key)
    with pytest.raises(Unauthenticated):
        auth.check(Operation.INFER, f"Bearer {key[:-1]}", None)


def test_the_entry_in_the_comment_appends_to_an_existing_key_list(tmp_path: Path) -> None:
    first = snooze("keys", "new", "--role", "readonly", "--name", "dash board", cwd=tmp_path)
    second = snooze("keys", "new", "--role", "admin", "--name", 'ops "root"', cwd=tmp_path)
    first_key, second_key = first.stdout.split("\n", 1)[0], second.stdout.split("\n", 1)[0]
    assert first_key != second_key
    [comment] = [line for line in second.stdout.splitlines() if "append" in line]
    entry = comment.split("`")[-2]  # `{ name = ..., },`
    listed = first.stdout.splitlines()[-1].replace("}]", f"}}, {entry}]")

    auth = authenticator(write(tmp_path, f"[auth]\n{listed}\n"), {})

    assert auth.check(Operation.SERVER_METADATA, None, first_key) == Principal(
        "dash board", "readonly", "api_key")
    assert auth.check(Operation.REPOSITORY_LOAD, None, second_key) == Principal(
        'ops "root"', "admin", "api_key")


def test_keys_new_refuses_an_unknown_role(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["keys", "new", "--role", "root", "--name", "ci"])
    assert info.value.code == exit_codes.USAGE
    assert "invalid choice: 'root'" in capsys.readouterr().err
