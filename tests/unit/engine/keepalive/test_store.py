"""The histories' file (engine/keepalive/store.py): written whole and read back, and every way
it can be wrong read as no history with a warning, never an error. (The daemon reading and
writing it: test_keeper.py and tests/integration/test_keepalive.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from snoozeml.engine.keepalive.histogram import IdleHistogram
from snoozeml.engine.keepalive.store import histories_json, read_histories, write_histories


def history(*gaps: float) -> IdleHistogram:
    found = IdleHistogram()
    for gap in gaps:
        found.add(gap)
    return found


def test_histories_are_written_and_read_back_and_empty_ones_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "keepalive.json"
    write_histories(path, histories_json({"a": history(1.0, 2.0, 60.0), "b": history()}))
    read = read_histories(path)
    assert list(read) == ["a"]
    assert read["a"].count == 3
    assert read["a"].percentile(0.5) == history(1.0, 2.0, 60.0).percentile(0.5)
    assert [p.name for p in path.parent.iterdir()] == ["keepalive.json"]  # no temporary left


def test_a_missing_file_is_no_history_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    assert read_histories(tmp_path / "keepalive.json") == {}
    assert caplog.text == ""


@pytest.mark.parametrize("text", ["", "[]", '{"format": 1}', '{"format": 2, "models": {}}',
                                  '{"format": 1, "models": []}'])
def test_a_file_of_the_wrong_shape_is_ignored_with_a_warning(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "keepalive.json"
    path.write_text(text)
    assert read_histories(path) == {}
    assert "WARNING" in caplog.text
    assert "keepalive_history_ignored" in caplog.text


def test_one_malformed_entry_is_ignored_and_the_others_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "keepalive.json"
    good = histories_json({"good": history(5.0)})
    path.write_text(good.replace('"models":{', '"models":{"bad":{"nonsense":true},'))
    assert list(read_histories(path)) == ["good"]
    assert "model=bad" in caplog.text


def test_a_path_that_cannot_be_read_or_written_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    folder = tmp_path / "keepalive.json"
    folder.mkdir()  # a folder where the file should be
    assert read_histories(folder) == {}
    write_histories(folder, "{}")
    assert "keepalive_history_ignored" in caplog.text
    assert "keepalive_history_unsaved" in caplog.text
    assert folder.is_dir()
