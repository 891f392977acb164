"""The checks of models.toml that look at more than one field (config/checks.py): replicas'
min against max (inherited too), their devices against the machine's, and a ModelMesh port of
its own."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_files import problems_of, write

from snoozeml.config.settings import load_config
from snoozeml.errors import ConfigError


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


def test_a_labels_file_is_resolved_against_the_config_file_and_must_exist(
    tmp_path: Path, model_file: Path
) -> None:
    (tmp_path / "models" / "labels.txt").write_text("cat\ndog\n")
    path = write(tmp_path, f"""
        [[models]]
        name = "a"
        path = "{model_file}"
        labels = "models/labels.txt"

        [[models]]
        name = "b"
        path = "{model_file}"
        labels = "models/missing.txt"
        """)

    assert problems_of(path) == [
        f"{path}:9: models[1].labels: no such file: {tmp_path / 'models' / 'missing.txt'}"]
    path.write_text(path.read_text().replace("missing.txt", "labels.txt"))
    models = load_config(path, {}).models
    assert [model.labels for model in models] == [tmp_path / "models" / "labels.txt"] * 2
    assert load_config(write(tmp_path, f"""
        [[models]]
        name = "a"
        path = "{model_file}"
        """), {}).models[0].labels is None
