"""`SNOOZE_*` environment variables (config/env.py): they override [server] keys, reach the
models that inherit them, are read as text turned into the key's type, and a bad value names
the variable."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_files import problems_of, write

from snoozeml.config.settings import load_config, parse_config
from snoozeml.errors import ConfigError


def test_snooze_environment_variables_override_server_keys(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        host = "0.0.0.0"
        http_port = 9000
        idle_timeout = "5m"
        log_level = "info"
    """)
    config = load_config(path, {
        "SNOOZE_HOST": "127.0.0.2",
        "SNOOZE_HTTP_PORT": "9100",
        "SNOOZE_GRPC_PORT": "9101",
        "SNOOZE_IDLE_TIMEOUT": "never",
        "SNOOZE_LOAD_TIMEOUT": "1m",
        "SNOOZE_DRAIN_TIMEOUT": "5s",
        "SNOOZE_MAX_REQUEST_SIZE": "2MiB",
        "SNOOZE_LOG_LEVEL": "DEBUG",
        "SNOOZE_HOST_BUDGET": "4GiB",
        "SNOOZE_GPU_BUDGET": "75%",
        "UNRELATED": "ignored",
    })
    server = config.server
    assert server.host == "127.0.0.2"
    assert server.http_port == 9100
    assert server.grpc_port == 9101
    assert server.idle_timeout is None
    assert server.load_timeout == 60.0
    assert server.drain_timeout == 5.0
    assert server.max_request_size == 2 * 2**20
    assert server.log_level == "debug"
    assert server.memory.host_budget == 4 * 2**30
    assert server.memory.gpu_budget == pytest.approx(0.75)


def test_environment_idle_timeout_reaches_models_that_inherit(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "tiny"
        path = "models/tiny.onnx"
    """)
    assert load_config(path, {"SNOOZE_IDLE_TIMEOUT": "2s"}).models[0].idle_timeout == 2.0


def test_invalid_environment_value_names_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nidle_timeout = \"5m\"\n")
    (problem,) = problems_of(path, {"SNOOZE_IDLE_TIMEOUT": "soon"})
    assert "server.idle_timeout" in problem
    assert "$SNOOZE_IDLE_TIMEOUT" in problem
    assert "invalid duration 'soon'" in problem


def test_a_budget_share_from_the_environment_is_a_share() -> None:
    config = parse_config({}, environ={"SNOOZE_HOST_BUDGET": "0.25"})
    assert config.server.memory.host_budget == pytest.approx(0.25)


def test_ports_from_the_environment_are_text_turned_into_integers(tmp_path: Path) -> None:
    path = write(tmp_path, "")

    config = load_config(path, {"SNOOZE_HTTP_PORT": "9000", "SNOOZE_GRPC_PORT": "0"})

    assert (config.server.http_port, config.server.grpc_port) == (9000, 0)
    assert problems_of(path, {"SNOOZE_GRPC_PORT": "abc"}) == [
        f'{path}: server.grpc_port (from $SNOOZE_GRPC_PORT): must be an integer, got "abc"'
    ]


def test_a_bad_connection_limit_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({}, environ={"SNOOZE_MAX_CONNECTIONS": "many"})
    assert "server.max_connections (from $SNOOZE_MAX_CONNECTIONS)" in str(caught.value)
