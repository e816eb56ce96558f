"""An in-memory index of unit vectors of one model, searched exactly: one float32 matrix whose
rows are the cells' vectors, scored against a query by one matrix-vector product (docs/design.md,
"Recall by meaning"). Rows of removed cells are reused by the next ones added. Each row keeps
the digest of the text its vector was made from, so that a caller holding a stored vector's
digest can take the row for it (`rows`) only when it is that vector."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from broker.amp.embedders import Vectors

_FIRST_ROWS = 1024


class VectorIndex:
    """The vectors of `dims` dimensions of a set of cells, by cell id."""

    def __init__(self, dims: int) -> None:
        self.dims = dims
        self._matrix: Vectors = np.zeros((_FIRST_ROWS, dims), dtype=np.float32)
        self._live = np.zeros(_FIRST_ROWS, dtype=bool)
        self._ids: list[str | None] = []
        self._digests: list[str] = []
        self._rows: dict[str, int] = {}
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, cell_id: object) -> bool:
        return cell_id in self._rows

    def put(self, cell_id: str, vector: bytes, digest: str = "") -> bool:
        """Add or replace a cell's vector (float32 bytes, made from a text of `digest`);
        False, and the cell left out, when it is not of this index's dimensions."""
        row = np.frombuffer(vector, dtype=np.float32)
        if row.shape != (self.dims,):
            self.remove(cell_id)
            return False
        at = self._rows.get(cell_id)
        if at is None:
            at = self._free.pop() if self._free else self._grow()
            self._rows[cell_id] = at
            self._ids[at] = cell_id
            self._live[at] = True
        self._matrix[at] = row
        self._digests[at] = digest
        return True

    def remove(self, cell_id: str) -> None:
        at = self._rows.pop(cell_id, None)
        if at is not None:
            self._ids[at] = None
            self._digests[at] = ""
            self._live[at] = False
            self._matrix[at] = 0.0
            self._free.append(at)

    def nearest(self, query: Vectors, limit: int) -> list[tuple[str, float]]:
        """Up to `limit` cells by falling cosine to the unit vector `query`."""
        used = len(self._ids)
        if not self._rows or limit <= 0 or query.shape != (self.dims,):
            return []
        scores = self._matrix[:used] @ query
        scores[~self._live[:used]] = -np.inf
        count = min(limit, len(self._rows))
        top = np.argpartition(-scores, count - 1)[:count] if count < used else np.arange(used)
        order = top[np.argsort(-scores[top], kind="stable")][:count]
        ids = self._ids
        return [(ids[i] or "", s) for i, s in zip(order.tolist(), scores[order].tolist(),
                                                   strict=True)]

    def rows(self, cell_ids: Sequence[str], digests: Sequence[str]) -> tuple[Vectors, list[int]]:
        """The vectors of the cells named, one row each in their order, taken only where the
        index holds the cell with the digest given beside it (a row of an older text, or of
        no known text, is never used); and the positions of those not taken, whose rows are
        zero, for the caller to fill or drop."""
        rows, held = self._rows.get, self._digests
        at: list[int] = []
        missing: list[int] = []
        for n, (cell_id, digest) in enumerate(zip(cell_ids, digests, strict=True)):
            row = rows(cell_id)
            if row is None or not digest or held[row] != digest:
                missing.append(n)
                row = 0
            at.append(row)
        matrix: Vectors = self._matrix.take(at, axis=0) if at else \
            np.zeros((0, self.dims), dtype=np.float32)
        if missing:
            matrix[missing] = 0.0
        return matrix, missing

    def _grow(self) -> int:
        """A new row at the end, the matrix doubled when full."""
        at = len(self._ids)
        if at == len(self._matrix):
            size = 2 * len(self._matrix)
            matrix = np.zeros((size, self.dims), dtype=np.float32)
            matrix[:at] = self._matrix
            live = np.zeros(size, dtype=bool)
            live[:at] = self._live
            self._matrix, self._live = matrix, live
        self._ids.append(None)
        self._digests.append("")
        return at
