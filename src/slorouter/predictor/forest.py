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
anyone uses it: the caller falls back to ``inplace_predict`` whenever it is None. Compiling reads the
booster's JSON arrays with orjson and builds every table with whole-array operations (no loop over nodes).
Inputs must be finite (the schema guarantees it), so XGBoost's missing-value branches never apply.
"""

from __future__ import annotations

import struct
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import orjson
import xgboost as xgb

_FULL = np.uint64((1 << 64) - 1)
_MAX_LEAVES = 64
_ONE = np.uint64(1)
_SIGN_FREE = np.int32(0x7FFFFFFF)
_ZERO32 = np.float32(0.0)
_LOW_BYTE = 0 if sys.byteorder == "little" else 7
_CHUNK_ROWS = 1024  # larger batches are evaluated in chunks of this many rows
_CACHE_BYTES = 16 << 20  # work arrays kept per forest (≈ 1.6 MB for 100 rows of two models, 16 MB for 1,024)
_LEAF_STRIDE = 256  # leaf-table entries per word: bases keep their lowest byte free for the leaf's bit count
_MAX_DEPTH = 64  # a walk deeper than this is a malformed tree (a tree of ≤ 64 leaves is at most 63 deep)


def _float_keys(values: np.ndarray) -> np.ndarray:
    """int32 keys ordered like the float32 ``values`` (finite; -0.0 and +0.0 get the same key)."""
    bits = np.add(values, _ZERO32, dtype=np.float32).view(np.int32)
    return bits ^ ((bits >> 31) & _SIGN_FREE)


@dataclass(frozen=True, slots=True, eq=False)
class _Trees:
    """One booster's trees packed into words (at most two trees per word), as arrays: every split node as
    (feature, threshold, word, mask of the leaves still reachable when its test is false), every leaf's
    value at its (layer, word, bit)."""

    feature: np.ndarray  # intp, per split node
    threshold: np.ndarray  # float32, per split node
    word: np.ndarray  # intp, per split node
    mask: np.ndarray  # uint64, per split node: all ones but the bits of the node's left subtree
    # (n_words + n_pairs, 64) float64: each word's first tree (row = word), then the second tree of each
    # of the first n_pairs words, which hold two (row = n_words + word)
    leaf_values: np.ndarray
    second: np.ndarray  # (n_pairs,) uint64: the bits of each pair's second tree
    base: float
    n_trees: int
    n_words: int
    n_features: int

    @property
    def n_pairs(self) -> int:
        return len(self.second)


class _Segment:
    """One output's trees: AND-tables whose rows line up with the forest's keys, the leaf table, the base."""

    __slots__ = ("active", "base", "leaf_bases", "leaf_values", "n_pairs", "n_words", "second", "tables")

    def __init__(self, part: _Trees, columns: Sequence[int], thresholds: Sequence[np.ndarray]) -> None:
        self.n_words = n_words = part.n_words
        self.n_pairs = part.n_pairs
        self.base = part.base
        column = np.asarray(columns, dtype=np.intp)[part.feature]
        # searchsorted lands one past a column's sentinel: a leading all-ones row aligns the tables with it.
        tables = [np.full((1, n_words), _FULL, dtype=np.uint64)]
        for c, values in enumerate(thresholds):
            # Row k + 1 of column c's block: the AND of the masks of this output's nodes on c whose threshold
            # is ≤ values[k] (a value placed after k + 1 keys makes exactly those tests false): each node's
            # mask in its threshold's row, then a running AND down the rows. Blocks of columns this output
            # does not read stay all ones (never gathered: they are not in ``active``).
            table = np.full((len(values) + 1, n_words), _FULL, dtype=np.uint64)
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
        table[:, 1 : _MAX_LEAVES + 1] = part.leaf_values
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

    def __init__(self, parts: Sequence[_Trees], columns: Sequence[Sequence[int]], n_columns: int) -> None:
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
    def from_booster(
        cls, booster: xgb.Booster, n_features: int, raw: bytes | None = None
    ) -> CompiledForest | None:
        """Compile ``booster``; None if the model is outside what this evaluator covers or disagrees.

        ``raw`` may be the booster's UBJSON (``save_raw("ubj")``, what the model store holds), which saves
        serialising it again. The model is read from UBJSON, whose typed arrays become numpy arrays without
        a per-number parse; should that fail, from XGBoost's JSON."""
        model = None if raw is None else _try_ubj(raw)  # None too if raw is JSON
        if model is None:
            model = _try_ubj(bytes(booster.save_raw("ubj")))
        try:
            if model is None:
                model = orjson.loads(booster.save_raw("json"))
            trees = _parse(model, n_features)
        except (KeyError, ValueError, TypeError, IndexError, OverflowError, orjson.JSONDecodeError):
            return None
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
                masks.fill(_FULL)
            # Each word as it is holds its first tree's exit leaf as the lowest set bit; a pair's word with
            # only its second tree's bits kept holds the second's.
            pairs = segment.n_pairs
            if pairs:
                np.bitwise_and(masks[:, :pairs], segment.second, out=sb.second_words)
            # Bits up to and including the lowest set one, counted into the low byte of each leaf index.
            np.subtract(sb.words, _ONE, out=sb.bits)
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


# ------------------------------------------------------------------------------------------- parsing


def _array(trees: list[dict[str, Any]], key: str, dtype: type) -> np.ndarray:
    values = [tree[key] for tree in trees]
    if all(isinstance(v, np.ndarray) for v in values):  # typed arrays read from UBJSON
        return np.concatenate(values).astype(dtype)
    return np.array(list(chain.from_iterable(values)), dtype=dtype)


def _parse(model: dict[str, Any], n_features: int) -> _Trees | None:
    """A booster's JSON (``save_raw("json")``) as packed trees; None if outside what this evaluator covers.

    All trees' node arrays are concatenated and walked level by level from the roots (depth ≤ 63), so
    the cost is a few numpy calls per level, not Python per node; unreachable (deleted) nodes are ignored.
    """
    learner = model["learner"]
    params = learner["learner_model_param"]
    if int(params.get("num_target", "1")) != 1 or int(params.get("num_class", "0")) > 1:
        return None
    booster = learner["gradient_booster"]
    if booster.get("name") != "gbtree":
        return None
    base_text = str(params["base_score"])
    base_values = orjson.loads(base_text) if base_text.startswith("[") else [float(base_text)]
    if len(base_values) != 1:
        return None
    trees: list[dict[str, Any]] = booster["model"]["trees"]
    if not trees or any(len(tree.get("categories_nodes", ())) for tree in trees):
        return None
    split_type = _array(trees, "split_type", np.int64) if all("split_type" in t for t in trees) else None
    if split_type is not None and split_type.any():
        return None
    sizes = np.array([len(tree["left_children"]) for tree in trees], dtype=np.intp)
    if not sizes.all():
        return None
    starts = np.zeros(len(trees), dtype=np.intp)
    np.cumsum(sizes[:-1], out=starts[1:])
    tree_of = np.repeat(np.arange(len(trees), dtype=np.intp), sizes)
    left = _array(trees, "left_children", np.intp)
    right = _array(trees, "right_children", np.intp)
    feature = _array(trees, "split_indices", np.intp)
    condition = _array(trees, "split_conditions", np.float64)
    if not (len(left) == len(right) == len(feature) == len(condition) == len(tree_of)):
        return None
    leaf = left == -1
    inner = ~leaf
    if (right[leaf] != -1).any():
        return None
    size_of = sizes[tree_of[inner]]
    if ((left[inner] < 0) | (left[inner] >= size_of) | (right[inner] < 0) | (right[inner] >= size_of)).any():
        return None
    # Children as indices into the concatenated arrays.
    left = np.where(leaf, -1, left + starts[tree_of])
    right = np.where(leaf, -1, right + starts[tree_of])

    levels = []
    frontier = starts
    while len(frontier):
        if len(levels) > _MAX_DEPTH or len(frontier) > len(left):
            return None
        levels.append(frontier)
        split = frontier[inner[frontier]]
        frontier = np.concatenate([left[split], right[split]])
    # Leaves under each node (bottom-up), then each node's first leaf in left-to-right order (top-down).
    count = np.ones(len(left), dtype=np.intp)
    for level in reversed(levels):
        split = level[inner[level]]
        count[split] = count[left[split]] + count[right[split]]
    leaves_per_tree = count[starts]
    if leaves_per_tree.max() > _MAX_LEAVES:
        return None
    first = np.zeros(len(left), dtype=np.intp)
    for level in levels:
        split = level[inner[level]]
        first[left[split]] = first[split]
        first[right[split]] = first[split] + count[left[split]]

    # Words holding two trees first, so that the second trees' words are a prefix.
    words = sorted(_pair(leaves_per_tree.tolist()), key=len, reverse=True)
    n_pairs = sum(len(word) == 2 for word in words)
    word_of = np.empty(len(trees), dtype=np.intp)
    shift_of = np.zeros(len(trees), dtype=np.intp)  # the tree's first bit in its word
    row_of = np.empty(len(trees), dtype=np.intp)  # the tree's row of leaf values
    second = np.zeros(n_pairs, dtype=np.uint64)
    for w, word in enumerate(words):
        word_of[word] = w
        row_of[word[0]] = w
        if len(word) == 2:
            shift_of[word[1]] = leaves_per_tree[word[0]]
            row_of[word[1]] = len(words) + w
            second[w] = _FULL ^ np.uint64((1 << int(leaves_per_tree[word[0]])) - 1)

    reached = np.concatenate(levels)
    splits = reached[inner[reached]]
    leaves = reached[leaf[reached]]
    split_feature = feature[splits]
    if ((split_feature < 0) | (split_feature >= n_features)).any():
        return None
    split_tree = tree_of[splits]
    # A false test removes the leaves of the node's left subtree: count[left] bits from its first leaf on.
    left_count = count[left[splits]].astype(np.uint64)  # ≤ 63: the right subtree has a leaf
    offset = (first[splits] + shift_of[split_tree]).astype(np.uint64)
    left_bits = np.left_shift(np.left_shift(_ONE, left_count) - _ONE, offset)
    leaf_tree = tree_of[leaves]
    leaf_values = np.zeros((len(words) + n_pairs, _MAX_LEAVES), dtype=np.float64)
    leaf_values[row_of[leaf_tree], first[leaves] + shift_of[leaf_tree]] = condition[leaves]
    return _Trees(
        feature=split_feature,
        threshold=condition[splits].astype(np.float32),
        word=word_of[split_tree],
        mask=np.invert(left_bits),
        leaf_values=leaf_values,
        second=second,
        base=float(base_values[0]),
        n_trees=len(trees),
        n_words=len(words),
        n_features=n_features,
    )


def _pair(leaf_counts: list[int]) -> list[list[int]]:
    """Trees into 64-bit words, at most two per word (as many pairs as fit: the smallest left tree with the
    largest that fits beside it), each word's trees in bit order."""
    order = sorted(range(len(leaf_counts)), key=lambda t: leaf_counts[t])
    words: list[list[int]] = []
    low, high = 0, len(order) - 1
    while low <= high:
        big = order[high]
        if low < high and leaf_counts[order[low]] + leaf_counts[big] <= _MAX_LEAVES:
            words.append([big, order[low]])
            low += 1
        else:
            words.append([big])
        high -= 1
    return words


# ------------------------------------------------------------------------------------------- UBJSON

# Big-endian numbers by UBJSON type marker (XGBoost writes its typed arrays, e.g. a tree's split conditions
# as float32, as "[$d#L<count>" followed by the raw values).
_UBJ_NUMBERS = {
    ord("i"): np.dtype(">i1"),
    ord("U"): np.dtype(">u1"),
    ord("I"): np.dtype(">i2"),
    ord("l"): np.dtype(">i4"),
    ord("L"): np.dtype(">i8"),
    ord("d"): np.dtype(">f4"),
    ord("D"): np.dtype(">f8"),
}
_UBJ_INTS = {ord(marker): struct.Struct(">" + code) for marker, code in ("ib", "UB", "Ih", "li", "Lq")}
_UBJ_INT64 = _UBJ_INTS[ord("L")]
_UBJ_CONSTANTS: dict[int, Any] = {ord("T"): True, ord("F"): False, ord("Z"): None}


def _ubj_loads(data: bytes) -> Any:
    """Decode UBJSON (draft 12, as XGBoost writes models): objects, arrays (with optional ``$`` type and
    ``#`` count), strings, numbers, booleans and null. A typed numeric array becomes a read-only numpy
    array over ``data`` (no copy, no per-number work); a scalar number a Python int or float. Raises
    ``ValueError`` on anything else (e.g. JSON text)."""
    if data[:1] != b"{" or data[1:2] in (b'"', b" ", b"\n", b"\t", b"\r"):
        raise ValueError("not a UBJSON object")
    value, end = _ubj_value(data, 1, data[0])
    if end != len(data):
        raise ValueError(f"trailing bytes after the UBJSON value at {end}")
    return value


def _try_ubj(data: bytes) -> Any:
    """``_ubj_loads(data)``, or None if ``data`` is not UBJSON this decoder reads."""
    try:
        return _ubj_loads(data)
    except (ValueError, IndexError, UnicodeDecodeError, struct.error):
        return None


def _ubj_int(data: bytes, pos: int, marker: int) -> tuple[int, int]:
    """The integer of type ``marker`` at ``pos``, and the position after it."""
    if marker == 0x4C:  # L, what XGBoost writes for every length and count
        return _UBJ_INT64.unpack_from(data, pos)[0], pos + 8
    number = _UBJ_INTS.get(marker)
    if number is None:
        raise ValueError(f"UBJSON: expected an integer marker at {pos - 1}, got {marker!r}")
    return number.unpack_from(data, pos)[0], pos + number.size


def _ubj_value(data: bytes, pos: int, marker: int) -> tuple[Any, int]:
    """The value whose marker (already read) precedes ``pos``, and the position after it."""
    if marker == 0x7B:  # {
        return _ubj_container(data, pos, is_object=True)
    if marker == 0x5B:  # [
        return _ubj_container(data, pos, is_object=False)
    if marker in _UBJ_INTS:
        return _ubj_int(data, pos, marker)
    if marker == 0x64:  # d
        return struct.unpack_from(">f", data, pos)[0], pos + 4
    if marker == 0x44:  # D
        return struct.unpack_from(">d", data, pos)[0], pos + 8
    if marker in (0x53, 0x48):  # S, H (a high-precision number, kept as its text)
        length, pos = _ubj_int(data, pos + 1, data[pos])
        if length < 0 or pos + length > len(data):
            raise ValueError("UBJSON: string out of bounds")
        return data[pos : pos + length].decode(), pos + length
    if marker == 0x43:  # C
        return chr(data[pos]), pos + 1
    if marker in _UBJ_CONSTANTS:
        return _UBJ_CONSTANTS[marker], pos
    raise ValueError(f"UBJSON: unknown marker {marker!r} at {pos - 1}")


def _ubj_container(data: bytes, pos: int, *, is_object: bool) -> tuple[Any, int]:
    kind = None
    count = -1
    if data[pos] == 0x24:  # $: one type for every value (then a count is required)
        kind = data[pos + 1]
        pos += 2
        if data[pos] != 0x23:
            raise ValueError("UBJSON: a typed container needs a count")
    if data[pos] == 0x23:  # #: the count
        count, pos = _ubj_int(data, pos + 2, data[pos + 1])
        if count < 0:
            raise ValueError("UBJSON: negative count")
    if not is_object and kind in _UBJ_NUMBERS:
        dtype = _UBJ_NUMBERS[kind]
        end = pos + count * dtype.itemsize
        if end > len(data):
            raise ValueError("UBJSON: typed array out of bounds")
        return np.frombuffer(data, dtype=dtype, count=count, offset=pos), end
    items: list[Any] = []
    keys: list[str] = []
    while True:
        if count >= 0:
            if len(items) == count:
                break
        elif data[pos] == (0x7D if is_object else 0x5D):  # } or ]
            pos += 1
            break
        if is_object:
            if data[pos] == 0x4C:
                length = _UBJ_INT64.unpack_from(data, pos + 1)[0]
                pos += 9
            else:
                length, pos = _ubj_int(data, pos + 1, data[pos])
            keys.append(data[pos : pos + length].decode())
            pos += length
        if kind is None:
            marker = data[pos]
            pos += 1
        else:
            marker = kind
        value, pos = _ubj_value(data, pos, marker)
        items.append(value)
    return (dict(zip(keys, items, strict=True)) if is_object else items), pos
