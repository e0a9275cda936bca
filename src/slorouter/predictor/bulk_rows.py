"""The prediction server's decoding of bulk rows into the union matrix ``Predictor.predict_all`` takes.

``JsonRows`` takes the parsed JSON rows, ``BinaryRows`` the binary body (docs/predictor-api.md); both accept
exactly what the library's validation (``rows_to_matrices``) accepts.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from slorouter.http.errors import RequestError
from slorouter.predictor.features import (
    DERIVED_FEATURES,
    EFFECTIVE_INPUT_TOKENS,
    FRACTION_FEATURES,
    INPUT_TOKEN_LENGTH,
    MAX_COUNT,
    POD_CLASS,
    POD_CLASS_CODES,
    PREFIX_CACHE_SCORE,
    FeatureError,
    FeatureSchema,
    rows_to_matrices,
)
from slorouter.predictor.wire import BINARY_ROWS_TYPE, FEATURE_NAMES_HEADER, ROW_DTYPE

_NUMBER_TYPES = frozenset({int, float})


class JsonRows:
    """The float32 matrix of the union of both models' features (``schema.all_features()`` order, which
    ``Predictor.predict_all`` takes) straight from bulk rows, for rows that are plainly valid.

    One ``itemgetter`` per row into one flat list, one type check over it, one ``np.array`` and vectorised
    range checks: about half the cost of the library's column-by-column validation. Anything not plainly
    valid (a missing or derived-only field, a non-number, a value out of range) returns None, and the caller
    runs the library's ``rows_to_matrices``, which names the bad row and field or derives what may be
    derived; so this path can only accept what the library accepts.
    """

    def __init__(self, schema: FeatureSchema) -> None:
        names = schema.all_features()
        self._width = len(names)
        self._getter = itemgetter(*names)
        self._low = np.zeros(len(names))
        self._high = np.array([1.0 if n in FRACTION_FEATURES else MAX_COUNT for n in names])
        self._pod_class = names.index(POD_CLASS) if POD_CLASS in names else None
        if self._pod_class is not None:
            self._high[self._pod_class] = POD_CLASS_CODES - 1

    def __call__(self, rows: list[Any]) -> np.ndarray | None:
        try:
            values = list(chain.from_iterable(map(self._getter, rows)))
        except (KeyError, TypeError):
            return None
        if not set(map(type, values)) <= _NUMBER_TYPES:  # bools and numeric strings would pass np.array
            return None
        try:
            matrix = np.array(values, dtype=np.float64).reshape(len(rows), self._width)
        except OverflowError:
            return None
        if not ((matrix >= self._low) & (matrix <= self._high)).all():
            return None
        if self._pod_class is not None and not np.array_equal(
            matrix[:, self._pod_class], np.floor(matrix[:, self._pod_class])
        ):
            return None
        return matrix.astype(np.float32)


class _Layout:
    """Where a binary body's columns go: the body column of each feature of the union."""

    __slots__ = ("columns", "derive", "union")

    def __init__(self, columns: list[str], union: np.ndarray, derive: int | None) -> None:
        self.columns = columns
        self.union = union
        self.derive = derive  # the union column of effective_input_tokens when it must be derived


class BinaryRows:
    """The union matrix (``schema.all_features()`` order) from a binary bulk body: little-endian float32
    rows whose columns are named by the ``X-Feature-Names`` header (any order; every feature of the schema,
    ``effective_input_tokens`` may be left out and is then derived; other columns are ignored). Validation
    is the library's: a bad value raises the same ``FeatureError`` naming its row and field as the JSON rows
    would."""

    def __init__(self, schema: FeatureSchema) -> None:
        self.schema = schema
        self._names = schema.all_features()
        self._bounds = self._bounds_of(self._names)
        self._layouts: dict[bytes, _Layout] = {}

    @staticmethod
    def _bounds_of(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, int | None]:
        high = np.array([1.0 if n in FRACTION_FEATURES else MAX_COUNT for n in names])
        pod_class = names.index(POD_CLASS) if POD_CLASS in names else None
        if pod_class is not None:
            high[pod_class] = POD_CLASS_CODES - 1
        return np.zeros(len(names)), high, pod_class

    def _layout(self, header: bytes | None) -> _Layout:
        if header is None:
            raise RequestError(f"a {BINARY_ROWS_TYPE} body needs the {FEATURE_NAMES_HEADER} header")
        layout = self._layouts.get(header)
        if layout is not None:
            return layout
        columns = [name.strip() for name in header.decode("latin-1").split(",")]
        if len(set(columns)) != len(columns):
            raise RequestError(f"{FEATURE_NAMES_HEADER} names a column twice: {', '.join(columns)}")
        missing = [n for n in self._names if n not in columns and n not in DERIVED_FEATURES]
        if missing:
            raise RequestError(f"{FEATURE_NAMES_HEADER} lacks required feature(s): {', '.join(missing)}")
        derive = None if EFFECTIVE_INPUT_TOKENS in columns else self._names.index(EFFECTIVE_INPUT_TOKENS)
        layout = _Layout(
            columns,
            np.array([columns.index(n) if n in columns else 0 for n in self._names], dtype=np.intp),
            derive,
        )
        if len(self._layouts) < 16:
            self._layouts[header] = layout
        return layout

    def __call__(self, body: bytes, header: bytes | None, max_rows: int) -> np.ndarray:
        layout = self._layout(header)
        width = len(layout.columns)
        row_bytes = ROW_DTYPE.itemsize * width
        if len(body) % row_bytes:
            raise RequestError(
                f"a {BINARY_ROWS_TYPE} body must hold whole rows of {width} float32 values "
                f"({row_bytes} bytes); got {len(body)} bytes"
            )
        n = len(body) // row_bytes
        if n > max_rows:
            raise RequestError(
                f"the body holds {n} rows; at most {max_rows} are allowed per request",
                param="rows",
                status=413,
            )
        raw = np.frombuffer(body, dtype=ROW_DTYPE).reshape(n, width)
        matrix = raw.take(layout.union, axis=1).astype(np.float32, copy=False)  # native order, C-contiguous
        if layout.derive is not None:  # as the library derives it: in float64, then float32
            names = self._names
            prefix = matrix[:, names.index(PREFIX_CACHE_SCORE)].astype(np.float64)
            length = matrix[:, names.index(INPUT_TOKEN_LENGTH)].astype(np.float64)
            matrix[:, layout.derive] = (1.0 - prefix) * length
        low, high, pod_class = self._bounds
        ok = (matrix >= low) & (matrix <= high)  # NaN fails both
        if pod_class is not None:
            ok[:, pod_class] &= np.floor(matrix[:, pod_class]) == matrix[:, pod_class]
        if not ok.all():
            self._raise_first_error(raw, layout.columns, int(np.flatnonzero(~ok.all(axis=1))[0]))
        return matrix

    def _raise_first_error(self, raw: np.ndarray, columns: list[str], index: int) -> None:
        row = dict(zip(columns, raw[index].astype(np.float64).tolist(), strict=True))
        rows_to_matrices([row], schema=self.schema, indices=[index])  # raises the library's FeatureError
        raise FeatureError(f"rows[{index}]: invalid feature values", index=index)  # not reached
