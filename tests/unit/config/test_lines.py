"""Where a problem in models.toml is and how it reads (config/lines.py): one problem per line,
naming the key (dotted, with the model's index) and the line, every problem of one kind
listed, and wrong types in the file's own words rather than coerced."""

from __future__ import annotations

from pathlib import Path

from config_files import problems_of, write


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
