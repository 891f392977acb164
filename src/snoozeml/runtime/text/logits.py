"""A text classifier's `logits` (a cross-encoder's scores), which must be finite numbers.

A model with broken weights (a NaN among them, or a float16 model whose arithmetic overflows)
answers NaN, and a NaN score sorts anywhere: a reranker would rank with it silently, and JSON
writes it as null. So a text classifier runs one short text pair when it loads
(`probe_blocking`): one whose logits are not finite fails its load, and the model is FAILED
saying why. A batch whose logits are not finite all the same (an input that overflows) fails
with a BackendError that says so, instead of answering them; its requests fail together, as
they would for any error of their run.
"""

from __future__ import annotations

import numpy as np

from snoozeml.errors import BackendError
from snoozeml.runtime.base import Arrays, Instance
from snoozeml.runtime.text.tokenizer import TEXT, TEXT_PAIR

LOGITS = "logits"
# What the load runs: a short query and document, in the model's own tokens.
PROBE = ("Is this model healthy?", "It answers finite scores.")


def check_logits(logits: np.ndarray, model: str) -> None:
    """BackendError, naming the model and what it answered, when a logit is NaN or infinite."""
    finite = np.isfinite(logits)
    if finite.all():
        return
    rows = finite.reshape(len(finite), -1).all(axis=1) if finite.ndim else finite.reshape(1)
    found = "NaN" if np.isnan(logits).any() else "infinite"
    raise BackendError(
        f"model {model!r} answered {found} logits for {int((~rows).sum())} of {rows.size} rows: "
        "its weights are broken, or its arithmetic overflows on these inputs")


def probe_blocking(instance: Instance) -> None:
    """Run one short text pair through a text classifier just loaded. RuntimeError (its load
    fails) when its logits are not finite."""
    inputs: Arrays = {TEXT: np.array([PROBE[0]], dtype=object),
                      TEXT_PAIR: np.array([PROBE[1]], dtype=object)}
    instance.validate_inputs(inputs)
    try:
        instance.run_blocking(inputs, [LOGITS])
    except BackendError as exc:
        raise RuntimeError(f"{exc} (a short text pair, run at load)") from None
