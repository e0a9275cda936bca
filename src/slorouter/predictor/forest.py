"""A vectorised evaluator for XGBoost tree ensembles (QuickScorer-style bitvectors in numpy).

Why: ``Booster.inplace_predict`` costs about 0.5 ms per call on this machine class even for one row (and
~1 ms for 100 rows × 200 trees), twice the router's whole budget for predicting both models. This evaluator
does the same arithmetic in about twenty numpy calls on preallocated arrays, for one booster or for several
at once (the TTFT and TPOT models in one pass: the calls are the same, only the arrays are wider).

How (Lucchese et al., "QuickScorer", SIGIR 2015): the leaves of each tree (at most 64) are numbered left to
right and a row's state in a tree is a bit mask of the leaves it can still reach, initially all. A split
node whose test ``x[f] < threshold`` is false removes the leaves of its left subtree. For a feature the false
nodes are exactly those with ``threshold ≤ x[f]``, a prefix of the feature's thresholds sorted ascending, so
the AND of their masks is precomputed per (feature, prefix length, word): one ``searchsorted`` (over all
features at once, on integer keys that order like the floats) then a table gather gives each (row, word)
mask, the AND over features leaves each tree's exit leaf as its lowest set bit, and that bit's index (a
popcount) selects the leaf value. Two trees whose leaves fit in 64 bits share a word, which halves the
tables and the gather/AND work: the word itself gives its first tree's exit leaf, the word with the first
tree's bits cleared its second's; both layers are processed as one contiguous ``(2, n, words)`` array,
because numpy's strided 2-d loops cost several times more. One matrix product sums each output's leaf
values. Thresholds come from XGBoost's histogram cuts (≤ 256 per feature), so the tables stay small (~1.5
MB for 200 trees over 8 features).

Several boosters (``CompiledForest.combine``) put their words side by side and read the columns of one
input matrix (a model's features by name: the TTFT and TPOT models share six), so a column both read is
placed and gathered once for both.

``CompiledForest.from_booster`` returns None for models it does not cover (trees of more than 64 leaves,
categorical splits, several outputs) and checks its own predictions against XGBoost's on probe rows before
anyone uses it: the caller falls back to ``inplace_predict`` whenever it is None. The trees come packed
from ``slorouter.predictor.forest_compiler``; the tables are built from them with whole-array operations.
Inputs must be finite (the schema guarantees it), so XGBoost's missing-value branches never apply.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

import numpy as np
import xgboost as xgb

from slorouter.predictor.forest_compiler import FULL, MAX_LEAVES, ONE, PackedTrees, pack_booster

_SIGN_FREE = np.int32(0x7FFFFFFF)
_ZERO32 = np.float32(0.0)
_LOW_BYTE = 0 if sys.byteorder == "little" else 7
_CHUNK_ROWS = 1024  # larger batches are evaluated in chunks of this many rows
_CACHE_BYTES = 16 << 20  # work arrays kept per forest (≈ 1.6 MB for 100 rows of two models, 16 MB for 1,024)
_LEAF_STRIDE = 256  # leaf-table entries per word: bases keep their lowest byte free for the leaf's bit count


def _float_keys(values: np.ndarray) -> np.ndarray:
    """int32 keys ordered like the float32 ``values`` (finite; -0.0 and +0.0 get the same key)."""
    bits = np.add(values, _ZERO32, dtype=np.float32).view(np.int32)
    return bits ^ ((bits >> 31) & _SIGN_FREE)


class _Segment:
    """One output's trees: AND-tables whose rows line up with the forest's keys, the leaf table, the base."""

    __slots__ = ("active", "base", "leaf_bases", "leaf_values", "n_pairs", "n_words", "second", "tables")

    def __init__(self, part: PackedTrees, columns: Sequence[int], thresholds: Sequence[np.ndarray]) -> None:
        self.n_words = n_words = part.n_words
        self.n_pairs = part.n_pairs
        self.base = part.base
        column = np.asarray(columns, dtype=np.intp)[part.feature]
        # searchsorted lands one past a column's sentinel: a leading all-ones row aligns the tables with it.
        tables = [np.full((1, n_words), FULL, dtype=np.uint64)]
        for c, values in enumerate(thresholds):
            # Row k + 1 of column c's block: the AND of the masks of this output's nodes on c whose threshold
            # is ≤ values[k] (a value placed after k + 1 keys makes exactly those tests false): each node's
            # mask in its threshold's row, then a running AND down the rows. Blocks of columns this output
            # does not read stay all ones (never gathered: they are not in ``active``).
            table = np.full((len(values) + 1, n_words), FULL, dtype=np.uint64)
            mine = column == c
            if mine.any():
                rows = np.searchsorted(values, part.threshold[mine]) + 1
                np.bitwise_and.at(table, (rows, part.word[mine]), part.mask[mine])
                np.bitwise_and.accumulate(table, axis=0, out=table)
            tables.append(table)
        self.tables = np.concatenate(tables)
        # Columns none of this output's trees splits on leave every mask whole: skip them.
        self.active = tuple(np.unique(column).tolist())
        # Value of bit k of leaf row r (a word's first tree, or a pair's second) at r × 256 + popcount(bits
        # up to k), i.e. + k + 1. float32, as XGBoost sums its leaves: half the cache footprint of float64.
        table = np.zeros((len(part.leaf_values), _LEAF_STRIDE), dtype=np.float32)
        table[:, 1 : MAX_LEAVES + 1] = part.leaf_values
        self.leaf_values = table.ravel()
        self.leaf_bases = np.arange(len(part.leaf_values), dtype=np.int64) * _LEAF_STRIDE
        self.second = part.second


class _SegmentBuffers:
    """One segment's work arrays for ``n`` rows, flat: ``(n, words)`` for each word's first tree, then
    ``(n, pairs)`` for the second trees of the words holding two, so that every operation on both is one
    contiguous pass. The words and bits are views of arrays all segments share (they run one after the
    other), and the leaf values are written over the bits, which are no longer needed by then: the fewer
    distinct bytes a prediction touches, the more of them stay in cache."""

    __slots__ = (
        "bits",
        "first_bits",
        "first_values",
        "first_words",
        "leaf_index",
        "leaf_low_bytes",
        "nbytes",
        "second_values",
        "second_words",
        "values",
        "words",
    )

    def __init__(self, n: int, segment: _Segment, words_memory: np.ndarray, bits_memory: np.ndarray) -> None:
        words, pairs = segment.n_words, segment.n_pairs
        size = n * (words + pairs)
        self.words = words_memory[:size]
        self.bits = bits_memory[:size]
        self.values = bits_memory.view(np.float32)[:size]
        self.first_words = self.words[: n * words].reshape(n, words)
        self.second_words = self.words[n * words :].reshape(n, pairs)
        self.first_bits = self.bits[: n * words].reshape(n, words)
        self.first_values = self.values[: n * words].reshape(n, words)
        self.second_values = self.values[n * words :].reshape(n, pairs)
        # Each leaf index: its row's base (a multiple of 256) in the upper bytes, written once, and the leaf's
        # bit count in the lowest byte, written by each prediction.
        self.leaf_index = np.empty(size, dtype=np.int64)
        bases = segment.leaf_bases
        self.leaf_index[: n * words].reshape(n, words)[:] = bases[:words]
        self.leaf_index[n * words :].reshape(n, pairs)[:] = bases[words:]
        self.leaf_low_bytes = self.leaf_index.view(np.uint8)[_LOW_BYTE::8]
        self.nbytes = self.leaf_index.nbytes


class _Buffers:
    """Work arrays for ``n`` rows, reused across calls (allocation and page faults are a large share of the
    cost at 100 rows): the keys of the input, then each segment's (each output in turn, so that the
    working set stays the size of one model's)."""

    __slots__ = ("bits", "keys", "n", "nbytes", "scratch", "segments", "transposed", "words")

    def __init__(self, n: int, forest: CompiledForest) -> None:
        self.n = n
        self.transposed = np.empty((forest.n_features, n), dtype=np.float32)
        self.scratch = np.empty((forest.n_features, n), dtype=np.int32)
        self.keys = np.empty((forest.n_features, n), dtype=np.int64)
        size = n * max(segment.n_words + segment.n_pairs for segment in forest._segments)
        self.words = np.empty(size, dtype=np.uint64)
        self.bits = np.empty(size, dtype=np.uint64)
        self.segments = tuple(
            _SegmentBuffers(n, segment, self.words, self.bits) for segment in forest._segments
        )
        arrays = (self.transposed, self.scratch, self.keys, self.words, self.bits)
        self.nbytes = sum(a.nbytes for a in arrays) + sum(s.nbytes for s in self.segments)


class CompiledForest:
    """Predicts the raw margins (base score + Σ leaf values) of one regression booster, or of several."""

    __slots__ = (
        "_buffers",
        "_columns",
        "_keys",
        "_lock",
        "_parts",
        "_prefix",
        "_segments",
        "_thresholds",
        "n_features",
        "n_layers",
        "n_outputs",
        "n_trees",
        "n_words",
    )

    def __init__(
        self, parts: Sequence[PackedTrees], columns: Sequence[Sequence[int]], n_columns: int
    ) -> None:
        """Output ``m`` is booster ``parts[m]``, whose feature ``j`` is column ``columns[m][j]`` of the
        input (``n_columns`` wide)."""
        if not parts or len(parts) != len(columns):
            raise ValueError("one column map per booster is needed")
        for part, cols in zip(parts, columns, strict=True):
            if len(cols) != part.n_features or not all(0 <= c < n_columns for c in cols):
                raise ValueError(f"column map {list(cols)} does not fit {part.n_features} features")
            if len(set(cols)) != len(cols):
                raise ValueError(f"column map {list(cols)} reads a column twice")
        self._parts = tuple(parts)
        self._columns = tuple(tuple(int(c) for c in cols) for cols in columns)
        self.n_outputs = len(parts)
        self.n_features = n_columns
        self.n_trees = sum(part.n_trees for part in parts)
        self.n_layers = 2 if any(part.n_pairs for part in parts) else 1
        self.n_words = sum(part.n_words for part in parts)
        # Each column's thresholds over every output that reads it, and their keys: a sentinel below any of
        # the column's values, then (c << 32) + the int32 key of each threshold; blocks ascend with c, so
        # one ``searchsorted`` places every column's values for every output.
        split_columns = np.concatenate(
            [np.asarray(cols, dtype=np.intp)[p.feature] for p, cols in zip(parts, self._columns, strict=True)]
        )
        split_thresholds = np.concatenate([p.threshold for p in parts])
        self._thresholds: list[np.ndarray] = []
        key_blocks = []
        for c in range(n_columns):
            values = np.unique(split_thresholds[split_columns == c]).astype(np.float32)
            block = np.empty(len(values) + 1, dtype=np.int64)
            block[0] = (c << 32) - (1 << 31)
            block[1:] = (c << 32) + _float_keys(values).astype(np.int64)
            key_blocks.append(block)
            self._thresholds.append(values)
        self._keys = np.concatenate(key_blocks)
        self._prefix = (np.arange(n_columns, dtype=np.int64) << 32)[:, None]
        self._segments = tuple(
            _Segment(part, cols, self._thresholds) for part, cols in zip(parts, self._columns, strict=True)
        )
        self._lock = threading.Lock()
        self._buffers: dict[int, _Buffers] = {}  # by row count, oldest first

    # ------------------------------------------------------------------------------------- building

    @classmethod
    def from_booster(cls, booster: xgb.Booster, n_features: int) -> CompiledForest | None:
        """Compile ``booster``; None if the model is outside what this evaluator covers or disagrees."""
        trees = pack_booster(booster, n_features)
        if trees is None:
            return None
        forest = cls([trees], [range(n_features)], n_features)
        if not forest._agrees_with(booster):
            return None
        return forest

    @classmethod
    def combine(
        cls, forests: Sequence[CompiledForest], columns: Sequence[Sequence[int]], n_columns: int
    ) -> CompiledForest:
        """One forest predicting the outputs of ``forests`` (single-output forests) in one call, on an input
        of ``n_columns`` columns of which forest ``m`` reads ``columns[m]``: the columns are placed once
        for all outputs.

        Raises ``ValueError`` for multi-output parts or maps that do not fit, and if the combined forest
        does not reproduce its parts on probe rows."""
        if any(forest.n_outputs != 1 for forest in forests):
            raise ValueError("only single-output forests can be combined")
        combined = cls([forest._parts[0] for forest in forests], columns, n_columns)
        probe = combined._probe_rows()
        got = combined.predict_outputs(probe)
        for m, forest in enumerate(forests):
            expected = forest.predict(probe[:, list(combined._columns[m])])
            if not np.allclose(got[m], expected, rtol=1e-9, atol=1e-9):
                raise ValueError(f"the combined forest disagrees with its part {m}")
        return combined

    # ------------------------------------------------------------------------------------ predicting

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Margins (float64, a new array) for the float32 rows of ``X`` (``(n, n_features)``, finite), of a
        single-output forest."""
        if self.n_outputs != 1:
            raise ValueError(f"this forest has {self.n_outputs} outputs: use predict_outputs")
        return self.predict_outputs(X)[0]

    def predict_outputs(self, X: np.ndarray) -> np.ndarray:
        """Margins of every output, ``(n_outputs, n)`` float64 (a new C-contiguous array)."""
        n = X.shape[0]
        if n == 0:
            return np.zeros((self.n_outputs, 0), dtype=np.float64)
        if n > _CHUNK_ROWS:  # bounded work arrays (and cache-sized passes) for large batches
            chunks = [self.predict_outputs(X[i : i + _CHUNK_ROWS]) for i in range(0, n, _CHUNK_ROWS)]
            return np.concatenate(chunks, axis=1)
        lock = self._lock
        if not lock.acquire(blocking=False):  # another thread is predicting: use arrays of our own
            return self._predict(X, _Buffers(n, self))
        try:
            buffers = self._buffers.get(n)
            if buffers is None:
                # Coalesced batches vary in size: keep the arrays of the most recent sizes, within a budget.
                cached = self._buffers
                total = sum(b.nbytes for b in cached.values())
                buffers = _Buffers(n, self)
                while cached and total + buffers.nbytes > _CACHE_BYTES:
                    total -= cached.pop(next(iter(cached))).nbytes
                cached[n] = buffers
            return self._predict(X, buffers)
        finally:
            lock.release()

    def _predict(self, X: np.ndarray, b: _Buffers) -> np.ndarray:
        # Keys of the values, feature-major: (f << 32) + int32 key of the float.
        np.add(X.T, _ZERO32, out=b.transposed)  # also turns -0.0 into +0.0
        bits = b.transposed.view(np.int32)
        scratch = b.scratch
        np.right_shift(bits, 31, out=scratch)
        scratch &= _SIGN_FREE
        bits ^= scratch
        np.add(bits, self._prefix, out=b.keys)
        # Row of each (feature, row) in the stacked tables (every segment's tables line up with the keys).
        positions = self._keys.searchsorted(b.keys.ravel(), side="right").reshape(b.keys.shape)
        n = b.n
        out = np.empty((self.n_outputs, n), dtype=np.float64)
        for m, (segment, sb) in enumerate(zip(self._segments, b.segments, strict=True)):
            masks, work, tables = sb.first_words, sb.first_bits, segment.tables
            active = segment.active
            if active:
                # Gather one feature's masks at a time and AND them in: the working set stays in cache.
                tables.take(positions[active[0]], axis=0, out=masks, mode="clip")
                for f in active[1:]:
                    tables.take(positions[f], axis=0, out=work, mode="clip")
                    masks &= work
            else:
                masks.fill(FULL)
            # Each word as it is holds its first tree's exit leaf as the lowest set bit; a pair's word with
            # only its second tree's bits kept holds the second's.
            pairs = segment.n_pairs
            if pairs:
                np.bitwise_and(masks[:, :pairs], segment.second, out=sb.second_words)
            # Bits up to and including the lowest set one, counted into the low byte of each leaf index.
            np.subtract(sb.words, ONE, out=sb.bits)
            sb.bits ^= sb.words
            np.bitwise_count(sb.bits, out=sb.leaf_low_bytes)
            segment.leaf_values.take(sb.leaf_index, out=sb.values, mode="clip")
            # Σ over each row's words: matrix-vector products.
            total = out[m]
            np.matmul(sb.first_values, _ones(segment.n_words), out=total, casting="same_kind")
            if pairs:
                total += np.matmul(sb.second_values, _ones(pairs))
            total += segment.base
        return out

    # -------------------------------------------------------------------------------------- checking

    def _probe_rows(self, rows: int = 512) -> np.ndarray:
        """Non-negative rows whose values sit at, just below and just above the thresholds."""
        rng = np.random.default_rng(0)
        X = np.empty((rows, self.n_features), dtype=np.float32)
        for f, thresholds in enumerate(self._thresholds):
            if len(thresholds) == 0:
                X[:, f] = 0.0
                continue
            picks = thresholds[rng.integers(0, len(thresholds), rows)]
            nudged = np.where(
                rng.random(rows) < 0.5,
                np.nextafter(picks, np.float32(-np.inf)),
                np.nextafter(picks, np.float32(np.inf)),
            )
            X[:, f] = np.where(rng.random(rows) < 0.3, picks, nudged).astype(np.float32)
        return np.abs(X)  # the schema's features are non-negative

    def _agrees_with(self, booster: xgb.Booster) -> bool:
        """Compare with XGBoost on probe rows that straddle every threshold."""
        X = self._probe_rows()
        expected = booster.inplace_predict(X, validate_features=False).astype(np.float64)
        got = self.predict(X)
        return bool(np.all(np.abs(got - expected) <= 1e-4 * (1.0 + np.abs(expected))))


_ONES: dict[int, np.ndarray] = {}


def _ones(n: int) -> np.ndarray:
    ones = _ONES.get(n)
    if ones is None:
        ones = _ONES[n] = np.ones(n, dtype=np.float32)
    return ones
