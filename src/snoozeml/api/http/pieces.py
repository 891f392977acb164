"""One request of many rows as pieces of one batch's worth, run at once through
`InferenceService.infer`: how the OpenAI and rerank routes (api/http/openai.py, rerank.py) put a
long list of texts through the model. Each piece is queued like any OIP request, so pieces of
many calls, and OIP requests for the same model, share batches; a cold model loads on the
first, and each piece counts in the model's metrics, statistics and status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from snoozeml.engine.requests.request import InferRequest, InferResponse
from snoozeml.engine.service import InferenceService

MAX_PIECES = 64


def piece_rows(count: int, max_batch_size: int) -> int:
    """Rows per piece: one batch's worth, so pieces of many calls share batches; the whole
    request at once for a model that does not batch; never more than MAX_PIECES pieces, so
    one request cannot fill the model's queue alone (a piece larger than a batch runs alone,
    it is never refused)."""
    if max_batch_size <= 1:
        return max(count, 1)
    return max(max_batch_size, -(-count // MAX_PIECES))


async def infer_pieces(service: InferenceService, name: str,
                       pieces: Sequence[InferRequest]) -> list[InferResponse]:
    """Every piece through the model at once; the answers in order. The first piece's error
    is the request's answer (the others are cancelled)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(service.infer(name, None, piece)) for piece in pieces]
    except ExceptionGroup as failed:
        raise _first(failed) from None
    return [task.result() for task in tasks]


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
