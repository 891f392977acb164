"""load_config on real files: defaults, resolution, inheritance, env overrides, error lines."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from snoozeml.config.settings import load_config, parse_config
from snoozeml.errors import ConfigError


def write(directory: Path, body: str, name: str = "models.toml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(body).lstrip("\n"))
    return path


def problems_of(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ or {})
    assert info.value.problems, "a ConfigError must list at least one problem"
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny.onnx"
    path.parent.mkdir()
    path.write_bytes(b"not read by load_config")
    return path


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


# --- invalid files: one problem per line, naming key and line ------------------------------


def test_unknown_key_names_the_key_and_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        host = "127.0.0.1"
        idel_timeout = "5m"
    """)
    assert problems_of(path) == [f"{path}:3: server.idel_timeout: unknown key"]


def test_unknown_key_in_a_model_names_the_model_index_and_line(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "a"
        path = "models/tiny.onnx"

        [[models]]
        name = "b"
        path = "models/tiny.onnx"
        colour = "blue"
    """)
    assert problems_of(path) == [f"{path}:8: models[1].colour: unknown key"]


def test_bad_duration_names_the_key_the_line_and_the_value(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "a"
        path = "models/tiny.onnx"
        idle_timeout = "5 minutes"
    """)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}:4: models[0].idle_timeout: invalid duration '5 minutes'")


def test_bad_size_names_the_nested_key_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        idle_timeout = "5m"

        [server.memory]
        host_budget = "lots"
    """)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}:5: server.memory.host_budget: invalid size 'lots'")


def test_missing_model_file_names_the_path_key_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "ghost"
        path = "models/ghost.onnx"
    """)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}:3: models[0].path: no such file or folder")
    assert "ghost.onnx" in problem


def test_duplicate_model_name_names_the_key_the_line_and_the_first_definition(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "twin"
        path = "models/tiny.onnx"

        [[models]]
        name = "twin"
        path = "models/tiny.onnx"
    """)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}:6: models[1].name: duplicate model name 'twin'")
    assert "models[0]" in problem


def test_missing_required_key_names_it(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "nameless-path"
    """)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}:1: models[0].path: missing required key")


def test_invalid_device_and_name_are_problems(tmp_path: Path, model_file: Path) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "-bad name"
        path = "models/tiny.onnx"
        device = "tpu"
    """)
    found = problems_of(path)
    assert len(found) == 2
    assert found[0].startswith(f"{path}:2: models[0].name: invalid model name")
    assert found[1].startswith(f"{path}:4: models[0].device: invalid device 'tpu'")


def test_every_problem_of_one_kind_is_listed(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        bogus = 1
        drain_timeout = "forever"
        http_port = 70000
    """)
    found = sorted(problems_of(path))
    assert len(found) == 3
    assert found[0] == f"{path}:2: server.bogus: unknown key"
    assert found[1].startswith(f"{path}:3: server.drain_timeout: invalid duration 'forever'")
    assert found[2].startswith(f"{path}:4: server.http_port:")
    assert "65535" in found[2]


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


def test_a_budget_share_from_the_environment_is_a_share() -> None:
    config = parse_config({}, environ={"SNOOZE_HOST_BUDGET": "0.25"})
    assert config.server.memory.host_budget == pytest.approx(0.25)


# --- types are TOML's, not coerced ---------------------------------------------------------


def test_a_value_of_the_wrong_type_is_a_problem_not_a_coercion(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, f"""
        [server]
        grpc_port = true
        http_port = "8080"
        host = ""

        [[models]]
        name = "a"
        path = "{model_file}"
        preload = "yes"
        intra_op_threads = 2.0
        memory_factor = true
        module = "nocolon"

        [models.batching]
        max_batch_size = 1.5
        """)

    assert problems_of(path) == [
        f"{path}:2: server.grpc_port: must be an integer, got true",
        f'{path}:3: server.http_port: must be an integer, got "8080"',
        f"{path}:4: server.host: String should have at least 1 character",
        f'{path}:9: models[0].preload: must be true or false, got "yes"',
        f"{path}:10: models[0].intra_op_threads: must be an integer, got 2.0",
        f"{path}:11: models[0].memory_factor: must be a number, got true",
        f"{path}:12: models[0].module: 'nocolon' must look like 'package.module:factory'",
        f"{path}:15: models[0].batching.max_batch_size: must be an integer, got 1.5",
    ]


def test_an_empty_model_path_is_a_problem(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "a"
        path = ""
        """)

    assert problems_of(path) == [f"{path}:3: models[0].path: must not be empty"]


def test_ports_from_the_environment_are_text_turned_into_integers(tmp_path: Path) -> None:
    path = write(tmp_path, "")

    config = load_config(path, {"SNOOZE_HTTP_PORT": "9000", "SNOOZE_GRPC_PORT": "0"})

    assert (config.server.http_port, config.server.grpc_port) == (9000, 0)
    assert problems_of(path, {"SNOOZE_GRPC_PORT": "abc"}) == [
        f'{path}: server.grpc_port (from $SNOOZE_GRPC_PORT): must be an integer, got "abc"'
    ]


def test_modelmesh_port_needs_a_port_of_its_own(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        grpc_port = 8085
        modelmesh_port = 8085
        """)

    assert problems_of(path) == [f"{path}:3: server.modelmesh_port: 8085 is also grpc_port: "
                                 "ModelMesh's SPI listens on a port of its own"]
    assert problems_of(write(tmp_path, ""), {"SNOOZE_MODELMESH_PORT": "8080"}) == [
        f"{tmp_path / 'models.toml'}: server.modelmesh_port (from $SNOOZE_MODELMESH_PORT): "
        "8080 is also http_port: ModelMesh's SPI listens on a port of its own"]
    config = load_config(write(tmp_path, ""), {"SNOOZE_MODELMESH_PORT": "8085"})
    assert (config.server.modelmesh_port, config.server.modelmesh_host) == (8085, "127.0.0.1")
    assert load_config(write(tmp_path, "")).server.modelmesh_port is None  # off by default


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


def test_invalid_replica_settings_name_the_key_and_the_line(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, f"""
        [[models]]
        name = "a"
        path = "{model_file}"
        [models.replicas]
        min = 3
        max = 2
        strategy = "random"
        devices = ["cpu", "tpu:0", "cpu", "auto"]

        [[models]]
        name = "b"
        path = "{model_file}"
        [models.replicas]
        max = 0
        target_queue = 0
        scale_up_after = "soon"
    """)
    assert problems_of(path) == [
        f"{path}:5: models[0].replicas.min: min = 3 is more than max = 2",
        f"{path}:7: models[0].replicas.strategy: Input should be 'least-queue' or "
        "'round-robin'",
        f"{path}:8: models[0].replicas.devices[1]: unknown device 'tpu:0' (expected cpu, "
        "cuda:N or mps)",
        f"{path}:8: models[0].replicas.devices[2]: device 'cpu' is listed twice",
        f"{path}:8: models[0].replicas.devices[3]: unknown device 'auto' (expected cpu, "
        "cuda:N or mps)",
        f"{path}:14: models[1].replicas.max: Input should be greater than or equal to 1",
        f"{path}:15: models[1].replicas.target_queue: Input should be greater than 0",
        f"{path}:16: models[1].replicas.scale_up_after: invalid duration 'soon' (expected e.g. "
        "'30s', '2ms', '5m')",
    ]


def test_min_above_an_inherited_max_names_the_models_key(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, f"""
        [server.replicas]
        max = 2

        [[models]]
        name = "a"
        path = "{model_file}"
        [models.replicas]
        min = 4
    """)
    assert problems_of(path) == [f"{path}:8: models[0].replicas.min: min = 4 is more than "
                                 "max = 2"]


def test_a_gpu_the_machine_does_not_have_is_an_unknown_device(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, f"""
        [[models]]
        name = "a"
        path = "{model_file}"
        [models.replicas]
        max = 2
        devices = ["cuda:0", "cuda:1"]
    """)
    with pytest.raises(ConfigError) as none:
        load_config(path, {}, gpus=[])
    assert none.value.problems == [
        f"{path}:6: models[0].replicas.devices[0]: unknown device 'cuda:0': this machine has "
        "no GPU",
        f"{path}:6: models[0].replicas.devices[1]: unknown device 'cuda:1': this machine has "
        "no GPU",
    ]
    with pytest.raises(ConfigError) as one:
        load_config(path, {}, gpus=["cuda:0"])
    assert one.value.problems == [
        f"{path}:6: models[0].replicas.devices[1]: unknown device 'cuda:1': this machine has "
        "cuda:0",
    ]
    # Without the machine's list (a config checked elsewhere), only the spelling is checked.
    assert load_config(path, {}).models[0].replicas.devices == ["cuda:0", "cuda:1"]


# --- auth --------------------------------------------------------------------------------------

KEY_HASH = "a" * 64


def test_auth_tables_are_read_and_their_files_resolved_against_the_config(
    tmp_path: Path,
) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "ops.key").write_text("snz_opskey-opskey-opskey-opskey-opskey\n")
    (tmp_path / "jwt.secret").write_text("s" * 40)
    path = write(tmp_path, f"""
        [auth]
        api_keys = [
            {{ name = "ci", role = "inference", sha256 = "{KEY_HASH}" }},
            {{ name = "ops", role = "admin", key_file = "keys/ops.key" }},
            {{ name = "bot", role = "readonly", key_env = "BOT_KEY" }},
        ]
        [auth.jwt]
        algorithms = ["HS256"]
        secret_file = "jwt.secret"
        issuer = "https://issuer.example"
        leeway = "5s"
    """)
    auth = load_config(path, {"BOT_KEY": " snz_bot-bot-bot-bot-bot-bot-bot-bot-bot\n"}).auth
    assert auth is not None
    assert auth.enabled
    assert [(k.name, k.role) for k in auth.api_keys] == [
        ("ci", "inference"), ("ops", "admin"), ("bot", "readonly")]
    assert auth.api_keys[1].key_file == tmp_path / "keys" / "ops.key"
    assert auth.jwt is not None
    assert auth.jwt.secret_file == tmp_path / "jwt.secret"
    assert (auth.jwt.issuer, auth.jwt.leeway, auth.jwt.role_claim) == (
        "https://issuer.example", 5.0, "role")


def test_no_auth_table_means_none(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "[server]\n"), {}).auth is None


def test_auth_problems_name_the_key_and_the_line(tmp_path: Path) -> None:
    (tmp_path / "short.secret").write_text("too short")
    path = write(tmp_path, f"""
        [auth]
        api_keys = [
            {{ name = "ci", role = "superuser", sha256 = "{KEY_HASH}" }},
            {{ name = "ci", role = "admin", sha256 = "not-a-hash" }},
            {{ name = "env", role = "admin", key_env = "NOT_SET" }},
            {{ name = "file", role = "admin", key_file = "missing.key" }},
            {{ name = "both", role = "admin", sha256 = "{KEY_HASH}", key_env = "X" }},
        ]
        [auth.jwt]
        algorithms = ["HS256", "HS999"]
        secret_env = "SNOOZE_JWT_SECRET"
    """)
    assert problems_of(path) == [
        f"{path}:2: auth.api_keys[0].role: Input should be 'readonly', 'inference' or 'admin'",
        f"{path}:2: auth.api_keys[1].name: duplicate key name 'ci' (first in api_keys[0])",
        f"{path}:2: auth.api_keys[1].sha256: must be 64 hexadecimal digits (the SHA-256 of the "
        "key, as `snooze keys new` prints it)",
        f"{path}:2: auth.api_keys[2].key_env: environment variable NOT_SET is not set",
        f"{path}:2: auth.api_keys[3].key_file: cannot read {tmp_path / 'missing.key'}: No such "
        "file or directory",
        f"{path}:2: auth.api_keys[4]: give exactly one of sha256, key_env or key_file (got "
        "sha256, key_env)",
        f"{path}:10: auth.jwt.algorithms[1]: Input should be 'HS256', 'HS384', 'HS512', "
        "'RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512' or "
        "'EdDSA'",
        f"{path}:11: auth.jwt.secret_env: environment variable SNOOZE_JWT_SECRET is not set",
    ]


def test_jwt_keys_must_exist_and_parse(tmp_path: Path) -> None:
    (tmp_path / "short.secret").write_text("too short")
    (tmp_path / "not.pem").write_text("hello")
    path = write(tmp_path, """
        [auth.jwt]
        algorithms = ["HS256", "RS256"]
        secret_file = "short.secret"
        public_key_file = "not.pem"
    """)
    problems = problems_of(path)
    assert problems[0] == (f"{path}:3: auth.jwt.secret_file: the secret is shorter than 32 "
                           "bytes, what HS256 needs (use a random secret at least as long as "
                           "its hash)")
    assert problems[1].startswith(f"{path}:4: auth.jwt.public_key_file: not a PEM public key: ")
    assert len(problems) == 2
    missing = write(tmp_path, """
        [auth.jwt]
        algorithms = ["ES256"]
    """)
    assert problems_of(missing) == [
        f"{missing}:2: auth.jwt.algorithms: ES256 need exactly one of public_key_file or "
        "jwks_file"]


def test_enabled_auth_without_any_credential_is_a_problem_and_disabled_is_not(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, """
        [auth]
        metrics_public = true
    """)
    assert problems_of(path) == [
        f"{path}:1: auth.enabled: auth is enabled but has no api_keys and no [auth.jwt]: no "
        "request could authenticate"]
    off = write(tmp_path, """
        [auth]
        enabled = false
    """)
    auth = load_config(off, {}).auth
    assert auth is not None
    assert auth.enabled is False


def test_weak_or_repeated_secrets_are_problems(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
        [auth]
        api_keys = [
            {{ name = "a", role = "admin", sha256 = "{KEY_HASH}" }},
            {{ name = "b", role = "readonly", sha256 = "{KEY_HASH.upper()}" }},
            {{ name = "c", role = "admin", key_env = "SHORT_KEY" }},
        ]
        [auth.jwt]
        algorithms = ["HS256", "HS512"]
        secret_env = "SECRET"
        leeway = "10m"
    """)
    assert problems_of(path, {"SHORT_KEY": "snz_short", "SECRET": "s" * 40}) == [
        f"{path}:2: auth.api_keys[1].sha256: the same key as api_keys[0] (one key, one name "
        "and role)",
        f"{path}:2: auth.api_keys[2].key_env: the key is shorter than 32 characters (make one "
        "with `snooze keys new`)",
        f"{path}:9: auth.jwt.secret_env: the secret is shorter than 64 bytes, what HS512 needs "
        "(use a random secret at least as long as its hash)",
        f"{path}:10: auth.jwt.leeway: Input should be less than or equal to 300",
    ]


def test_disabled_auth_needs_none_of_its_secrets(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [auth]
        enabled = false
        api_keys = [{ name = "c", role = "admin", key_env = "NOT_SET" }]
        [auth.jwt]
        algorithms = ["HS256"]
        secret_env = "NOT_SET_EITHER"
    """)
    auth = load_config(path, {}).auth
    assert auth is not None
    assert auth.enabled is False


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


def test_a_bad_connection_limit_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({}, environ={"SNOOZE_MAX_CONNECTIONS": "many"})
    assert "server.max_connections (from $SNOOZE_MAX_CONNECTIONS)" in str(caught.value)
