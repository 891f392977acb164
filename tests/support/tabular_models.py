"""Tabular models made by the real libraries and exported by the real converters with their
defaults (skl2onnx's `to_onnx`, onnxmltools' `convert_xgboost` / `convert_lightgbm`), kept with
the fitted model so that a test holds the daemon's answers to its `predict` and
`predict_proba`. Small data and few trees: the whole set fits in a few seconds."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

FEATURES = 8
CITIES = ("paris", "oslo", "lima", "kyoto")
TIERS = np.array(["bronze", "silver", "gold"])


@dataclass
class Tabular:
    """A fitted model, its exported file, and the data it was fitted on."""

    name: str
    model: Any
    path: Path
    label_output: str
    probability_output: str | None  # None for a regressor
    classes: tuple[str, ...]


def features(rows: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """FP32 features and int classes 0-2, as make_classification gives them."""
    from sklearn.datasets import make_classification

    x, y = make_classification(rows, FEATURES, n_informative=4, n_classes=3, random_state=seed)
    return x.astype(np.float32), y.astype(np.int64)


def frame(rows: int = 200, seed: int = 0) -> Any:
    """A pandas frame of one FP32, one INT64 and one string column, and classes from them."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    age = rng.uniform(18, 80, rows).astype(np.float32)
    visits = rng.integers(0, 20, rows).astype(np.int64)
    city = np.array(CITIES, dtype=object)[rng.integers(0, len(CITIES), rows)]
    score = (age / 30 + visits / 7 + (city == "oslo") * 1.5 + rng.normal(0, 0.4, rows))
    tier = TIERS[np.digitize(score, np.quantile(score, [1 / 3, 2 / 3]))]
    return pd.DataFrame({"age": age, "visits": visits, "city": city}), tier


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def sklearn_models(folder: Path) -> dict[str, Tabular]:
    """skl2onnx's default exports (`to_onnx(model, X[:1])`): ZipMap on every classifier."""
    from skl2onnx import to_onnx
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler
    from sklearn.svm import SVC

    x, y = features()
    words = TIERS[y]
    made = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SVC's probability is deprecated in 1.9, still there
        fitted = {
            "logistic": (LogisticRegression(max_iter=500).fit(x, y), True),
            "forest": (RandomForestClassifier(12, max_depth=5, random_state=0).fit(x, words), True),
            "boosting": (GradientBoostingClassifier(n_estimators=12, random_state=0).fit(x, words),
                         True),
            "svc": (SVC(probability=True, random_state=0).fit(x, y), True),
            "regressor": (RandomForestRegressor(8, max_depth=4, random_state=0).fit(x, y * 1.5),
                          False),
        }
        for name, (model, classifier) in fitted.items():
            path = _save(to_onnx(model, x[:1]), folder / f"{name}.onnx")
            made[name] = Tabular(
                name, model, path, "output_label" if classifier else "variable",
                "output_probability" if classifier else None,
                tuple(str(c) for c in model.classes_) if classifier else ())
        table, tiers = frame()
        pipeline = Pipeline([
            ("columns", ColumnTransformer([
                ("numbers", StandardScaler(), ["age", "visits"]),
                ("words", OneHotEncoder(handle_unknown="ignore"), ["city"]),
            ])),
            ("classifier", LogisticRegression(max_iter=500)),
        ]).fit(table, tiers)
        path = _save(to_onnx(pipeline, table[:1]), folder / "columns.onnx")
    made["columns"] = Tabular("columns", pipeline, path, "output_label", "output_probability",
                              tuple(str(c) for c in pipeline.classes_))
    return made


def boosted_models(folder: Path) -> dict[str, Tabular]:
    """onnxmltools' default exports of XGBoost (tensor outputs) and LightGBM (ZipMap), and
    CatBoost's own export (ZipMap)."""
    import lightgbm
    import xgboost
    from onnxmltools import convert_lightgbm, convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    x, y = features(seed=1)
    types = [("input", FloatTensorType([None, FEATURES]))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xgb = xgboost.XGBClassifier(n_estimators=12, max_depth=3, random_state=0).fit(x, y)
        lgb = lightgbm.LGBMClassifier(n_estimators=12, num_leaves=8, random_state=0,
                                      verbose=-1).fit(x, TIERS[y])
        xgb_path = _save(convert_xgboost(xgb, initial_types=types), folder / "xgboost.onnx")
        lgb_path = _save(convert_lightgbm(lgb, initial_types=types), folder / "lightgbm.onnx")
    return {
        "catboost": catboost_model(folder, x, y),
        "xgboost": Tabular("xgboost", xgb, xgb_path, "label", "probabilities",
                           tuple(str(c) for c in xgb.classes_)),
        "lightgbm": Tabular("lightgbm", lgb, lgb_path, "label", "probabilities",
                            tuple(str(c) for c in lgb.classes_)),
    }


def catboost_model(folder: Path, x: np.ndarray, y: np.ndarray) -> Tabular:
    """CatBoost's own ONNX export (`save_model(..., format="onnx")`), string classes."""
    from catboost import CatBoostClassifier

    model = CatBoostClassifier(iterations=20, depth=4, random_seed=0, verbose=0,
                               allow_writing_files=False).fit(x, TIERS[y])
    path = folder / "catboost.onnx"
    model.save_model(str(path), format="onnx")
    return Tabular("catboost", model, path, "label", "probabilities",
                   tuple(str(c) for c in model.classes_))


def multi_output(folder: Path) -> Path:
    """skl2onnx's MultiOutputClassifier: its probabilities are a sequence of tensors."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression
    from sklearn.multioutput import MultiOutputClassifier

    x, y = features(seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MultiOutputClassifier(LogisticRegression(max_iter=300)).fit(x, np.c_[y, y % 2])
        return _save(to_onnx(model, x[:1]), folder / "multi_output.onnx")
