"""A text classifier's logits: finite ones pass, NaN or infinite ones are a BackendError that
names the model, what it answered and for how many rows."""

from __future__ import annotations

import numpy as np
import pytest

from snoozeml.errors import BackendError
from snoozeml.runtime.text.logits import check_logits


def test_finite_logits_pass() -> None:
    check_logits(np.array([[0.5, -3.0], [1e30, 0.0]], dtype=np.float32), "m")
    check_logits(np.zeros((0, 1), dtype=np.float32), "m")


@pytest.mark.parametrize(("logits", "message"), [
    (np.array([[0.1], [np.nan], [0.3]], dtype=np.float32),
     "model 'm' answered NaN logits for 1 of 3 rows"),
    (np.array([[np.nan, 1.0], [np.inf, np.nan]], dtype=np.float32),
     "model 'm' answered NaN logits for 2 of 2 rows"),
    (np.array([[1.0, -np.inf]], dtype=np.float16),
     "model 'm' answered infinite logits for 1 of 1 rows"),
    (np.array([np.nan, 2.0]), "model 'm' answered NaN logits for 1 of 2 rows"),
])
def test_logits_that_are_not_finite_are_a_backend_error_saying_so(
    logits: np.ndarray, message: str
) -> None:
    with pytest.raises(BackendError) as caught:
        check_logits(logits, "m")

    assert str(caught.value) == (f"{message}: its weights are broken, or its arithmetic "
                                 "overflows on these inputs")
