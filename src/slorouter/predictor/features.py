"""The feature schema shared by training and prediction, and the validated conversion of rows to matrices.

One schema, versioned, decides the columns and their order for both models; the trainer stores it in
every model's metadata and the predictor refuses a model whose schema differs from the one it expects, so
training and prediction can never disagree on the columns (the original's feature flags had to be kept in
sync by hand between its servers, and a mismatch broke prediction).

Columns (all float32 in the matrices; counts are token or request counts):

- TTFT: ``kv_cache_percentage`` (0..1), ``input_token_length``, ``num_request_waiting``,
  ``num_request_running``, ``prefill_tokens_in_flight``, ``decode_tokens_in_flight``, ``prefix_cache_score``
  (0..1), ``effective_input_tokens`` = (1 − prefix_cache_score) × input_token_length (derived when absent).
- TPOT: ``kv_cache_percentage``, ``input_token_length``, ``num_request_waiting``, ``num_request_running``,
  ``prefill_tokens_in_flight``, ``decode_tokens_in_flight``, ``num_tokens_generated`` (the request's output
  length: the tokens its TPOT was averaged over in a sample, the expected output length, e.g. ``max_tokens``,
  in a prediction).
- With ``FeatureSchema(pod_class=True)``, both gain a last column ``pod_class``: the code of an endpoint label
  value (e.g. the GPU type), see ``pod_class_code``.

Every listed field is required (only derived ones may be omitted): a missing value is an error, never a
silent zero. Extra keys in a row are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import xxhash

# 2: ``prefill_tokens_in_flight`` counts only the prompt tokens the prefix index does not expect the endpoint
# to hold (1 counted whole prompts); models trained on version-1 rows are refused and retrained.
SCHEMA_VERSION: Final = 2

ModelKind = Literal["ttft", "tpot"]
MODEL_KINDS: Final[tuple[ModelKind, ModelKind]] = ("ttft", "tpot")

KV_CACHE_PERCENTAGE: Final = "kv_cache_percentage"
INPUT_TOKEN_LENGTH: Final = "input_token_length"
NUM_REQUEST_WAITING: Final = "num_request_waiting"
NUM_REQUEST_RUNNING: Final = "num_request_running"
PREFILL_TOKENS_IN_FLIGHT: Final = "prefill_tokens_in_flight"
DECODE_TOKENS_IN_FLIGHT: Final = "decode_tokens_in_flight"
PREFIX_CACHE_SCORE: Final = "prefix_cache_score"
EFFECTIVE_INPUT_TOKENS: Final = "effective_input_tokens"
NUM_TOKENS_GENERATED: Final = "num_tokens_generated"
POD_CLASS: Final = "pod_class"

_COMMON: Final = (
    KV_CACHE_PERCENTAGE,
    INPUT_TOKEN_LENGTH,
    NUM_REQUEST_WAITING,
    NUM_REQUEST_RUNNING,
    PREFILL_TOKENS_IN_FLIGHT,
    DECODE_TOKENS_IN_FLIGHT,
)
TTFT_FEATURES: Final[tuple[str, ...]] = (*_COMMON, PREFIX_CACHE_SCORE, EFFECTIVE_INPUT_TOKENS)
TPOT_FEATURES: Final[tuple[str, ...]] = (*_COMMON, NUM_TOKENS_GENERATED)
ALL_FEATURES: Final[tuple[str, ...]] = (*TTFT_FEATURES, NUM_TOKENS_GENERATED)

FRACTION_FEATURES: Final = frozenset({KV_CACHE_PERCENTAGE, PREFIX_CACHE_SCORE})
DERIVED_FEATURES: Final = frozenset({EFFECTIVE_INPUT_TOKENS})
MAX_COUNT: Final = 1e15  # counts beyond this are nonsense (and lose integer precision in float32 anyway)
POD_CLASS_CODES: Final = 1 << 24  # codes are exact in float32 below 2**24


class FeatureError(ValueError):
    """A row or value that cannot be used; the message names the row and the field."""

    def __init__(self, message: str, *, index: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.field = field


class SchemaMismatchError(ValueError):
    """A model trained on a feature schema other than the one the reader expects."""


def pod_class_code(label_value: str | None) -> int:
    """Stable integer code of an endpoint label value (e.g. ``"H100"``) for the ``pod_class`` column.

    0 means "no label"; any other value maps to ``1 + xxh32(value) mod (2**24 − 1)``: the same on every
    process and machine, needs no registry of known values (pods may come and go), and is exact in float32.
    """
    if not label_value:
        return 0
    return 1 + xxhash.xxh32_intdigest(label_value.encode("utf-8")) % (POD_CLASS_CODES - 1)


@dataclass(frozen=True, slots=True)
class FeatureSchema:
    """The columns of both models. Stored (``to_dict``) with every model; compared on load."""

    version: int = SCHEMA_VERSION
    pod_class: bool = False

    def features(self, kind: ModelKind) -> tuple[str, ...]:
        base = _base_features(kind)
        return (*base, POD_CLASS) if self.pod_class else base

    def all_features(self) -> tuple[str, ...]:
        return (*ALL_FEATURES, POD_CLASS) if self.pod_class else ALL_FEATURES

    def union_columns(self, kind: ModelKind) -> slice | list[int]:
        """Where ``kind``'s features sit in ``all_features()`` rows (a slice, faster to index with, when they
        are a contiguous ascending run)."""
        union = self.all_features()
        columns = [union.index(name) for name in self.features(kind)]
        start = columns[0]
        if columns == list(range(start, start + len(columns))):
            return slice(start, start + len(columns))
        return columns

    def key(self) -> dict[str, Any]:
        """Version and ``pod_class`` flag, which decide the columns and their meaning (samples carry this)."""
        return {"version": self.version, "pod_class": self.pod_class}

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "pod_class": self.pod_class,
            "ttft": list(self.features("ttft")),
            "tpot": list(self.features("tpot")),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureSchema:
        schema = cls(version=int(data["version"]), pod_class=bool(data.get("pod_class", False)))
        if schema.version == SCHEMA_VERSION and schema.to_dict() != dict(data):
            raise SchemaMismatchError(f"feature schema {dict(data)} does not match version {schema.version}")
        return schema

    def check(self, stored: Mapping[str, Any], *, what: str = "model") -> None:
        """Raise ``SchemaMismatchError`` unless ``stored`` (a ``to_dict``) is exactly this schema."""
        expected = self.to_dict()
        if dict(stored) != expected:
            raise SchemaMismatchError(
                f"{what} was trained on feature schema {dict(stored)}, but this reader expects {expected}; "
                "retrain with the current schema (or run a matching slorouter version)"
            )


DEFAULT_SCHEMA: Final = FeatureSchema()


def _base_features(kind: str) -> tuple[str, ...]:
    if kind == "ttft":
        return TTFT_FEATURES
    if kind == "tpot":
        return TPOT_FEATURES
    raise ValueError(f"unknown model kind {kind!r}; valid kinds: {', '.join(MODEL_KINDS)}")


def check_kind(kind: str) -> ModelKind:
    if kind == "ttft":
        return "ttft"
    if kind == "tpot":
        return "tpot"
    raise ValueError(f"unknown model kind {kind!r}; valid kinds: {', '.join(MODEL_KINDS)}")


# ----------------------------------------------------------------------------------------- validation

_FAST_TYPES: Final = frozenset({int, float})
_MISSING: Final = object()


def _location(where: str, index: int, field: str | None) -> str:
    base = where.format(i=index) if "{i}" in where else f"{where}[{index}]"
    return f"{base}.{field}" if field else base


def _check_value(value: object, name: str) -> str | None:
    """Why ``value`` is not acceptable for ``name`` (None if it is)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        return f"must be a number, got {type(value).__name__}"
    try:
        number = float(value)
    except OverflowError:
        return f"must be at most {MAX_COUNT:g}, got {value}"
    if not math.isfinite(number):
        return f"must be finite, got {number}"
    if name in FRACTION_FEATURES:
        if not 0.0 <= number <= 1.0:
            return f"must be between 0 and 1, got {value}"
    elif name == POD_CLASS:
        if not (number.is_integer() and 0 <= number < POD_CLASS_CODES):
            return f"must be an integer code in [0, {POD_CLASS_CODES}), got {value}"
    elif number < 0:
        return f"must be >= 0, got {value}"
    elif number > MAX_COUNT:
        return f"must be at most {MAX_COUNT:g}, got {value}"
    return None


def _range_violations(name: str, values: np.ndarray) -> np.ndarray:
    """Boolean mask of values out of range for ``name`` (NaN and infinities included)."""
    with np.errstate(invalid="ignore"):
        if name in FRACTION_FEATURES:
            ok = (values >= 0.0) & (values <= 1.0)
        elif name == POD_CLASS:
            ok = (values >= 0) & (values < POD_CLASS_CODES) & (np.floor(values) == values)
        else:
            ok = (values >= 0.0) & (values <= MAX_COUNT)
    return ~ok


def _raise_first_error(
    rows: Sequence[object], names: Sequence[str], where: str, indices: Sequence[int] | None
) -> None:
    """Row-major scan for the first bad row/field, so the reported error does not depend on the fast path."""
    for position, row in enumerate(rows):
        index = indices[position] if indices is not None else position
        if not isinstance(row, Mapping):
            raise FeatureError(
                f"{_location(where, index, None)}: must be an object of feature values, "
                f"got {type(row).__name__}",
                index=index,
            )
        for name in names:
            value = row.get(name, _MISSING)
            if value is _MISSING or value is None:
                if name in DERIVED_FEATURES:
                    continue
                raise FeatureError(
                    f"{_location(where, index, name)}: required field is missing", index=index, field=name
                )
            problem = _check_value(value, name)
            if problem:
                raise FeatureError(f"{_location(where, index, name)}: {problem}", index=index, field=name)


def _extract(
    rows: Sequence[Mapping[str, object]], names: Sequence[str], where: str, indices: Sequence[int] | None
) -> dict[str, np.ndarray]:
    """Validated float64 columns for ``names``; derived columns absent from every row are left out."""
    columns: dict[str, np.ndarray] = {}
    try:
        for name in names:
            if name in DERIVED_FEATURES:
                values = [row.get(name) for row in rows]
                if all(v is None for v in values):
                    continue
                if any(v is None for v in values):  # some rows give it: derive for the others one by one
                    _raise_first_error(rows, names, where, indices)
                    values = _fill_derived(rows, name, values)
            else:
                values = [row[name] for row in rows]
            if not set(map(type, values)) <= _FAST_TYPES:
                raise TypeError(name)
            column = np.array(values, dtype=np.float64)
            if _range_violations(name, column).any():
                raise ValueError(name)
            columns[name] = column
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
        _raise_first_error(rows, names, where, indices)
        # Valid after all (numpy scalars, say): convert value by value.
        for name in names:
            values = [row.get(name) for row in rows]
            if name in DERIVED_FEATURES:
                if all(v is None for v in values):
                    continue
                values = _fill_derived(rows, name, values)
            columns[name] = np.array([_as_float(v) for v in values], dtype=np.float64)
    return columns


def _fill_derived(rows: Sequence[Mapping[str, object]], name: str, values: list[object]) -> list[object]:
    assert name == EFFECTIVE_INPUT_TOKENS
    return [
        v
        if v is not None
        else (1.0 - _as_float(row[PREFIX_CACHE_SCORE])) * _as_float(row[INPUT_TOKEN_LENGTH])
        for v, row in zip(values, rows, strict=True)
    ]


def _as_float(value: object) -> float:
    """A value that ``_check_value`` accepts, as a float."""
    assert isinstance(value, int | float | np.integer | np.floating)
    return float(value)


def _assemble(columns: Mapping[str, np.ndarray | float], names: Sequence[str], n: int) -> np.ndarray:
    matrix = np.empty((n, len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        column = columns.get(name)
        if column is None:
            if name != EFFECTIVE_INPUT_TOKENS:
                raise FeatureError(f"columns.{name}: required column is missing", field=name)
            column = (1.0 - np.asarray(columns[PREFIX_CACHE_SCORE], dtype=np.float64)) * np.asarray(
                columns[INPUT_TOKEN_LENGTH], dtype=np.float64
            )
        matrix[:, j] = column
    return matrix


def rows_to_matrix(
    rows: Sequence[Mapping[str, object]],
    kind: ModelKind,
    *,
    where: str = "rows",
    schema: FeatureSchema = DEFAULT_SCHEMA,
    indices: Sequence[int] | None = None,
) -> np.ndarray:
    """Validate ``rows`` and return the float32 C-contiguous ``(len(rows), n_features)`` matrix of ``kind``.

    Raises ``FeatureError`` naming the first bad row and field, e.g.
    ``rows[3].kv_cache_percentage: must be between 0 and 1, got 1.7``. ``where`` is the location prefix:
    ``"samples"`` gives ``samples[3].field``; a template with ``{i}`` such as
    ``"samples[{i}].features"`` gives ``samples[3].features.field``. ``indices`` maps row positions to
    the indices to report (for a caller that validates a subset of its input).
    """
    names = schema.features(kind)
    columns = _extract(rows, names, where, indices)
    return _assemble(columns, names, len(rows))


def rows_to_matrices(
    rows: Sequence[Mapping[str, object]],
    *,
    where: str = "rows",
    schema: FeatureSchema = DEFAULT_SCHEMA,
    indices: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Both models' matrices from rows carrying the union of the features (each field validated once)."""
    columns = _extract(rows, schema.all_features(), where, indices)
    n = len(rows)
    return _assemble(columns, schema.features("ttft"), n), _assemble(columns, schema.features("tpot"), n)


def columns_to_union_matrix(
    columns: Mapping[str, np.ndarray | float], *, schema: FeatureSchema = DEFAULT_SCHEMA
) -> np.ndarray:
    """``columns_to_matrix`` for the union of both models' features (``schema.all_features()`` order): one
    matrix from which ``schema.union_columns(kind)`` selects each model's columns."""
    return _columns_matrix(columns, schema.all_features())


def _columns_matrix(columns: Mapping[str, np.ndarray | float], names: tuple[str, ...]) -> np.ndarray:
    """The ``names`` columns as a matrix; the row count is the length of the first 1-d column (1 if none)."""
    n = 1
    for value in columns.values():
        if np.ndim(value) >= 1:
            n = int(np.shape(value)[0])
            break
    try:
        return _assemble(columns, names, n)
    except KeyError as exc:
        raise FeatureError(f"columns.{exc.args[0]}: required column is missing", field=exc.args[0]) from None


def columns_to_matrix(
    columns: Mapping[str, np.ndarray | float],
    kind: ModelKind,
    *,
    schema: FeatureSchema = DEFAULT_SCHEMA,
) -> np.ndarray:
    """The matrix of ``kind`` from per-feature columns (the router's candidate arrays), no per-row Python.

    Scalars broadcast (e.g. the request's ``input_token_length`` for every candidate); the row count is the
    length of the first 1-d column (1 if all are scalars). ``effective_input_tokens`` is derived when absent.
    Values are trusted (no range checks): this is the hot path over data the router produced itself.
    """
    return _columns_matrix(columns, schema.features(kind))
