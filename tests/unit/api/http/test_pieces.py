"""How a request of many rows is cut into pieces (api/http/pieces.py)."""

from __future__ import annotations

import pytest

from snoozeml.api.http.pieces import piece_rows


@pytest.mark.parametrize(("count", "max_batch_size", "rows"), [
    (1, 32, 32),  # one piece
    (100, 32, 32),  # four pieces: they share batches with other calls
    (2048, 2, 32),  # at most 64 pieces, whatever the batch size
    (2048, 0, 2048),  # a model that does not batch runs the request at once
    (5, 1, 5),
])
def test_a_request_goes_in_pieces_of_one_batch_and_never_more_than_64(
    count: int, max_batch_size: int, rows: int,
) -> None:
    assert piece_rows(count, max_batch_size) == rows
    assert -(-count // rows) <= 64
