"""examples/python/tabular.py (docs/tabular.md) against a real daemon serving a scikit-learn
pipeline exported by skl2onnx with its defaults: what it prints is what the fitted pipeline's
predict and predict_proba give for the example's two customers, and its classification lines
name each row's two best classes by the model's own labels."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd
import pytest
from daemon import Daemon
from tabular_models import frame

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "python" / "tabular.py"
CUSTOMERS = pd.DataFrame({"age": np.array([34.0, 61.0], np.float32),
                          "visits": np.array([2, 15], np.int64),
                          "city": np.array(["oslo", "lima"], dtype=object)})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Any]]:
    from skl2onnx import to_onnx
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder

    folder = tmp_path_factory.mktemp("tabular-example")
    table, tiers = frame(rows=300, seed=4)
    pipeline = Pipeline([
        ("columns", ColumnTransformer([("city", OneHotEncoder(handle_unknown="ignore"),
                                        ["city"])], remainder="passthrough")),
        ("forest", RandomForestClassifier(20, max_depth=5, random_state=0)),
    ]).fit(table, tiers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx.save(to_onnx(pipeline, table[:1]), str(folder / "tiers.onnx"))
    config = folder / "models.toml"
    config.write_text('[[models]]\nname = "tiers"\npath = "tiers.onnx"\n', encoding="utf-8")
    daemon = Daemon(config)
    try:
        daemon.start()
        yield daemon, pipeline
    finally:
        daemon.stop()


def test_the_tabular_example_prints_what_the_pipeline_predicts(
    served: tuple[Daemon, Any],
) -> None:
    daemon, pipeline = served
    env = {**os.environ, "SNOOZE_URL": daemon.url}
    env.pop("SNOOZE_API_KEY", None)

    done = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)

    assert done.returncode == 0, done.stderr
    probabilities = pipeline.predict_proba(CUSTOMERS)
    classes = [str(c) for c in pipeline.classes_]
    expected = []
    for row, (label, scores) in enumerate(zip(pipeline.predict(CUSTOMERS), probabilities,
                                              strict=True)):
        expected.append(f"row {row}: {label} " + " ".join(f"{s:.4f}" for s in scores))
    for row, scores in enumerate(probabilities):
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:2]
        expected.append(f"row {row} best: " + " ".join(
            f"{scores[i]:f}:{i}:{classes[i]}" for i in order))
    assert done.stdout.splitlines() == expected
