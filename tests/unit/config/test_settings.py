"""load_config on real files (config/settings.py): defaults, resolution, inheritance, units,
the file's own failures, and the limits and metrics keys of [server]. (Environment
overrides: test_env.py; problems' keys and lines: test_lines.py; cross-field checks:
test_checks.py; [auth]: test_auth.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from config_files import problems_of, write

from snoozeml.config.settings import load_config, parse_config
from snoozeml.errors import ConfigError

# --- valid files -------------------------------------------------------------------------


def test_empty_file_gives_every_default(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), {})
    server = config.server
    assert server.host == "127.0.0.1"
    assert server.http_port == 8080
    assert server.grpc_port == 8081
    assert server.idle_timeout == 300.0
    assert server.load_timeout == 300.0
    assert server.drain_timeout == 30.0
    assert server.max_request_size == 64 * 2**20
    assert server.log_level == "info"
    assert server.memory.host_budget == pytest.approx(0.8)
    assert server.memory.gpu_budget == pytest.approx(0.9)
    assert config.models == []
    assert config.source == (tmp_path / "models.toml").resolve()


def test_model_defaults_and_relative_path_resolved_against_the_config_file(
    tmp_path: Path, model_file: Path
) -> None:
    elsewhere = tmp_path / "conf"
    elsewhere.mkdir()
    (elsewhere / "models").mkdir()
    (elsewhere / "models" / "tiny.onnx").write_bytes(b"x")
    path = write(elsewhere, """
        [[models]]
        name = "tiny"
        path = "models/tiny.onnx"
    """)
    (model,) = load_config(path, {}).models
    assert model.path == elsewhere / "models" / "tiny.onnx"
    assert model.path.is_absolute()
    assert model.format == "onnx"
    assert model.device == "auto"
    assert model.preload is False
    assert model.intra_op_threads == 1
    assert model.tensorrt is False
    assert model.idle_timeout == 300.0
    assert model.load_timeout == 300.0


def test_absolute_model_path_is_kept(tmp_path: Path, model_file: Path) -> None:
    path = write(tmp_path, f"""
        [[models]]
        name = "tiny"
        path = "{model_file}"
    """)
    assert load_config(path, {}).models[0].path == model_file


@pytest.mark.parametrize(
    ("make", "fmt"),
    [
        (lambda d: (d / "m.onnx").write_bytes(b"x") and "m.onnx", "onnx"),
        (lambda d: (d / "m.safetensors").write_bytes(b"x") and "m.safetensors", "torch"),
        (lambda d: (d / "hf").mkdir() or "hf", "torch"),
    ],
    ids=["onnx-file", "safetensors-file", "folder"],
)
def test_format_is_inferred_from_the_path(tmp_path: Path, make: object, fmt: str) -> None:
    relative = make(tmp_path)  # type: ignore[operator]
    path = write(tmp_path, f"""
        [[models]]
        name = "m"
        path = "{relative}"
    """)
    assert load_config(path, {}).models[0].format == fmt


def test_explicit_format_wins_over_inference(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    path = write(tmp_path, """
        [[models]]
        name = "m"
        path = "weights.bin"
        format = "onnx"
    """)
    assert load_config(path, {}).models[0].format == "onnx"


def test_unknown_file_kind_is_a_problem_naming_the_path_key_and_line(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    path = write(tmp_path, """
        [[models]]
        name = "m"
        path = "weights.bin"
    """)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}:3: models[0].path: cannot tell the format")


def test_idle_timeout_is_inherited_overridden_or_pinned(tmp_path: Path, model_file: Path) -> None:
    path = write(tmp_path, """
        [server]
        idle_timeout = "90s"
        load_timeout = "2m"

        [[models]]
        name = "inherits"
        path = "models/tiny.onnx"

        [[models]]
        name = "overrides"
        path = "models/tiny.onnx"
        idle_timeout = "1s"
        load_timeout = "10s"

        [[models]]
        name = "pinned"
        path = "models/tiny.onnx"
        idle_timeout = "never"
    """)
    models = {m.name: m for m in load_config(path, {}).models}
    assert models["inherits"].idle_timeout == 90.0
    assert models["inherits"].load_timeout == 120.0
    assert models["overrides"].idle_timeout == 1.0
    assert models["overrides"].load_timeout == 10.0
    assert models["pinned"].idle_timeout is None
    assert models["pinned"].load_timeout == 120.0


def test_keep_alive_is_fixed_by_default_inherited_from_server_or_set_per_model(
    tmp_path: Path, model_file: Path
) -> None:
    assert load_config(write(tmp_path, ""), {}).server.keep_alive == "fixed"
    path = write(tmp_path, """
        [server]
        keep_alive = "adaptive"

        [[models]]
        name = "inherits"
        path = "models/tiny.onnx"

        [[models]]
        name = "fixed"
        path = "models/tiny.onnx"
        keep_alive = "fixed"
    """)
    models = {m.name: m.keep_alive for m in load_config(path, {}).models}
    assert models == {"inherits": "adaptive", "fixed": "fixed"}
    from_env = load_config(write(tmp_path, """
        [[models]]
        name = "m"
        path = "models/tiny.onnx"
    """), {"SNOOZE_KEEP_ALIVE": "adaptive"})
    assert from_env.models[0].keep_alive == "adaptive"


def test_an_unknown_keep_alive_is_a_problem_naming_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        keep_alive = "smart"
    """)
    (problem,) = problems_of(path)
    assert problem == f"{path}:2: server.keep_alive: Input should be 'fixed' or 'adaptive'"


def test_server_never_pins_every_model_that_does_not_override(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, """
        [server]
        idle_timeout = "never"

        [[models]]
        name = "inherits"
        path = "models/tiny.onnx"

        [[models]]
        name = "own"
        path = "models/tiny.onnx"
        idle_timeout = "30s"
    """)
    models = {m.name: m for m in load_config(path, {}).models}
    assert models["inherits"].idle_timeout is None
    assert models["own"].idle_timeout == 30.0


def test_sizes_and_memory_budgets_accept_units(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        max_request_size = "1KiB"
        [server.memory]
        host_budget = "6GiB"
        gpu_budget = "50%"
    """)
    server = load_config(path, {}).server
    assert server.max_request_size == 1024
    assert server.memory.host_budget == 6 * 2**30
    assert server.memory.gpu_budget == pytest.approx(0.5)


# --- invalid files (each problem's key, line and wording: test_lines.py) --------------------------


def test_bad_toml_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        idle_timeout = "5m
    """)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}: invalid TOML")
    assert "line 2" in problem


def test_unreadable_config_is_a_config_error(tmp_path: Path) -> None:
    (problem,) = problems_of(tmp_path / "absent.toml")
    assert "cannot read config" in problem


@pytest.mark.parametrize(("value", "wanted"), [
    ('"2GiB"', "less than or equal to 2147483647"),
    ("0", "greater than or equal to 1"),
])
def test_grpc_max_message_size_must_fit_grpcs_limit(
    tmp_path: Path, value: str, wanted: str
) -> None:
    path = write(tmp_path, f"""
        [server]
        grpc_max_message_size = {value}
    """)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}:2: server.grpc_max_message_size: ")
    assert wanted in problem


def test_grpc_max_message_size_accepts_units_and_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        grpc_max_message_size = "1MiB"
    """)
    assert load_config(path, {}).server.grpc_max_message_size == 2**20
    environ = {"SNOOZE_GRPC_MAX_MESSAGE_SIZE": "2047MiB"}
    assert load_config(path, environ).server.grpc_max_message_size == 2047 * 2**20


@pytest.mark.parametrize(("server", "key"), [
    ({"max_request_size": 0}, "server.max_request_size"),
    ({"grpc_max_message_size": "0B"}, "server.grpc_max_message_size"),
    ({"memory": {"host_budget": 0}}, "server.memory.host_budget"),
])
def test_a_size_or_budget_of_zero_is_refused(server: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"server": server}, environ={})
    assert key in str(caught.value)


def test_an_empty_model_path_is_a_problem(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "a"
        path = ""
        """)

    assert problems_of(path) == [f"{path}:3: models[0].path: must not be empty"]


def test_a_config_that_is_not_utf8_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_bytes(b"\xff\xfe[server]\n")

    assert problems_of(path) == [
        f"{path}: cannot read config: not UTF-8 text (invalid start byte at byte 0)"
    ]


# --- replicas ----------------------------------------------------------------------------------


def test_replicas_default_to_one_and_inherit_server_keys_the_model_leaves_out(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, f"""
        [server.replicas]
        target_queue = 2
        scale_down_after = "5s"
        strategy = "round-robin"

        [[models]]
        name = "plain"
        path = "{model_file}"

        [[models]]
        name = "busy"
        path = "{model_file}"
        [models.replicas]
        max = 3
        strategy = "least-queue"
        devices = ["cpu"]
    """)
    plain, busy = load_config(path, {}).models
    assert (plain.replicas.min, plain.replicas.max) == (0, 1)
    assert (plain.replicas.target_queue, plain.replicas.scale_down_after) == (2, 5.0)
    assert plain.replicas.strategy == "round-robin"
    assert plain.replicas.scale_up_after == 1.0
    assert (busy.replicas.max, busy.replicas.strategy, busy.replicas.devices) == (
        3, "least-queue", ["cpu"])
    assert busy.replicas.target_queue == 2


# --- connection and header limits ([server], issue 15) ----------------------------------------


def test_connection_limits_have_safe_defaults(tmp_path: Path) -> None:
    server = load_config(write(tmp_path, ""), {}).server
    assert server.max_header_size == 16 * 1024
    assert server.max_request_line == 8 * 1024
    assert server.max_connections == 1024
    assert server.keep_alive_timeout == 5.0
    assert server.header_timeout == 10.0
    assert server.body_timeout == 60.0
    assert server.grpc_max_metadata_size == 16 * 1024
    assert server.grpc_max_concurrent_streams == 100
    assert server.grpc_keepalive_time == 60.0
    assert server.grpc_keepalive_timeout == 20.0
    assert server.grpc_keepalive_min_time == 10.0


def test_connection_limits_take_units_and_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        max_header_size = "32KiB"
        max_request_line = 4096
        max_connections = 64
        keep_alive_timeout = "750ms"
        header_timeout = "3s"
        body_timeout = "2m"
        grpc_max_metadata_size = "1MiB"
        grpc_max_concurrent_streams = 16
        grpc_keepalive_time = "30s"
        grpc_keepalive_timeout = "5s"
        grpc_keepalive_min_time = "1m"
    """)
    server = load_config(path, {}).server
    assert (server.max_header_size, server.max_request_line) == (32 * 1024, 4096)
    assert server.max_connections == 64
    assert (server.keep_alive_timeout, server.header_timeout, server.body_timeout) == (
        0.75, 3.0, 120.0)
    assert (server.grpc_max_metadata_size, server.grpc_max_concurrent_streams) == (2**20, 16)
    assert (server.grpc_keepalive_time, server.grpc_keepalive_timeout,
            server.grpc_keepalive_min_time) == (30.0, 5.0, 60.0)
    server = load_config(path, {
        "SNOOZE_MAX_CONNECTIONS": "8", "SNOOZE_GRPC_MAX_CONCURRENT_STREAMS": "4",
        "SNOOZE_HEADER_TIMEOUT": "2", "SNOOZE_MAX_HEADER_SIZE": "8KiB",
        "SNOOZE_GRPC_KEEPALIVE_MIN_TIME": "20s",
    }).server
    assert (server.max_connections, server.grpc_max_concurrent_streams) == (8, 4)
    assert (server.header_timeout, server.max_header_size) == (2.0, 8 * 1024)
    assert server.grpc_keepalive_min_time == 20.0


@pytest.mark.parametrize(("line", "wanted"), [
    ("max_header_size = 0", "greater than or equal to 1"),
    ("max_request_line = \"0B\"", "greater than or equal to 1"),
    ("max_connections = 0", "greater than or equal to 1"),
    ("max_connections = \"100\"", "must be an integer"),
    ("keep_alive_timeout = \"0s\"", "greater than 0"),
    ("header_timeout = 0", "greater than 0"),
    ("body_timeout = \"soon\"", "invalid duration 'soon'"),
    ("grpc_max_metadata_size = \"2GiB\"", "less than or equal to 2147483647"),
    ("grpc_max_concurrent_streams = 0", "greater than or equal to 1"),
    ("grpc_keepalive_time = \"25d\"", "invalid duration"),
    ("grpc_keepalive_timeout = \"1000h\"", "less than or equal to 2147483.647"),
    ("grpc_keepalive_min_time = 0", "greater than 0"),
])
def test_a_connection_limit_out_of_range_names_the_key_and_the_line(
    tmp_path: Path, line: str, wanted: str
) -> None:
    path = write(tmp_path, f"[server]\n{line}\n")
    (problem,) = problems_of(path)
    key = line.split(" = ")[0]
    assert problem.startswith(f"{path}:2: server.{key}: "), problem
    assert wanted in problem, problem


# --- [server.metrics] -----------------------------------------------------------------------------


def test_server_metrics_is_on_and_per_model_by_default_and_each_key_can_be_turned_off() -> None:
    assert parse_config({}).server.metrics.enabled is True
    assert parse_config({}).server.metrics.per_model is True
    off = parse_config({"server": {"metrics": {"enabled": False, "per_model": False}}})
    assert (off.server.metrics.enabled, off.server.metrics.per_model) == (False, False)


def test_a_wrong_server_metrics_key_is_a_problem_naming_key_and_line(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text('[server.metrics]\nper_model = "no"\nscrape = true\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    problems = "\n".join(info.value.problems)
    assert "models.toml:2: server.metrics.per_model" in problems
    assert "models.toml:3: server.metrics.scrape" in problems


def test_a_model_that_tokenizes_batches_128_rows_unless_its_entry_says() -> None:
    from snoozeml.config.settings import TEXT_MAX_BATCH_SIZE, ModelConfig

    text = ModelConfig.model_validate({"name": "t", "path": "m", "tokenize": True,
                                       "batching": {"max_delay": "1ms"}})
    chosen = ModelConfig.model_validate({"name": "t", "path": "m", "tokenize": True,
                                         "batching": {"max_batch_size": 8,
                                                      "max_batch_tokens": 64}})
    plain = ModelConfig.model_validate({"name": "p", "path": "m"})

    assert (text.batching.max_batch_size, text.batching.max_delay) == (TEXT_MAX_BATCH_SIZE, 0.001)
    assert TEXT_MAX_BATCH_SIZE == 128
    assert text.batching.max_batch_tokens is None
    assert (chosen.batching.max_batch_size, chosen.batching.max_batch_tokens) == (8, 64)
    assert plain.batching.max_batch_size == 32
