"""A vectorised evaluator for XGBoost tree ensembles (QuickScorer-style bitvectors in numpy).

Why: ``Booster.inplace_predict`` costs about 0.5 ms per call on this machine class even for one row (and
~1 ms for 100 rows × 200 trees), twice the router's whole budget for predicting both models. This evaluator
does the same arithmetic in about twenty numpy calls on preallocated arrays, ≈ 0.15-0.2 ms for 100 rows ×
200 depth-6 trees.

How (Lucchese et al., "QuickScorer", SIGIR 2015): the leaves of each tree (at most 64, depth ≤ 6) are
numbered left to right and a row's state in a tree is a bit mask of the leaves it can still reach,
initially all. A split node whose test ``x[f] < threshold`` is false removes the leaves of its left subtree.
For a feature the false nodes are exactly those with ``threshold ≤ x[f]``, a prefix of the feature's
thresholds sorted ascending, so the AND of their masks is precomputed per (feature, prefix length, word):
one ``searchsorted`` (over all features at once, on integer keys that order like the floats) then a table
gather gives each (row, word) mask, the AND over features leaves each tree's exit leaf as its lowest set
bit, and that bit's index (a popcount) selects the leaf value. Two trees whose leaves fit in 64 bits
share a word, which halves the tables and the gather/AND work: the word itself gives its first tree's exit
leaf, the word with the first tree's bits cleared its second's; both layers are processed as one
contiguous ``(2, n, words)`` array, because numpy's strided 2-d loops cost several times more. Thresholds
come from XGBoost's histogram cuts (≤ 256 per feature), so the tables stay small (~1 MB for 200 trees
over 8 features).

``CompiledForest.from_booster`` returns None for models it does not cover (deeper trees, categorical
splits, several outputs) and checks its own predictions against XGBoost's on probe rows before anyone uses
it: the caller falls back to ``inplace_predict`` whenever it is None. Inputs must be finite (the schema
guarantees it), so XGBoost's missing-value branches never apply.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import numpy as np
import xgboost as xgb

_FULL = (1 << 64) - 1
_MAX_LEAVES = 64
_ONE = np.uint64(1)
_SIGN_FREE = np.int32(0x7FFFFFFF)
_ZERO32 = np.float32(0.0)
_LOW_BYTE = 0 if sys.byteorder == "little" else 7
_CHUNK_ROWS = 1024  # larger batches are evaluated in chunks of this many rows
_CACHE_BYTES = 16 << 20  # work arrays kept per forest (≈ 0.8 MB for 100 rows, 8 MB for 1,024)
_LEAF_STRIDE = 256  # leaf-table entries per word: bases keep their lowest byte free for the leaf's bit count


def _float_keys(values: np.ndarray) -> np.ndarray:
    """int32 keys ordered like the float32 ``values`` (finite; -0.0 and +0.0 get the same key)."""
    bits = np.add(values, _ZERO32, dtype=np.float32).view(np.int32)
    return bits ^ ((bits >> 31) & _SIGN_FREE)


class _Buffers:
    """Work arrays for ``n`` rows, reused across calls (allocation and page faults are a large share of the
    cost at 100 rows). Per-tree arrays are ``(layers, n, words)``: layer 0 holds each word's first tree,
    layer 1 its second; every operation on them is one contiguous pass."""

    __slots__ = (
        "bits",
        "keys",
        "leaf_index",
        "leaf_low_bytes",
        "n",
        "nbytes",
        "scratch",
        "second",
        "transposed",
        "values",
        "words",
    )

    def __init__(self, n: int, forest: CompiledForest) -> None:
        self.n = n
        n_features, n_words, layers = forest.n_features, forest.n_words, forest.n_layers
        self.transposed = np.empty((n_features, n), dtype=np.float32)
        self.scratch = np.empty((n_features, n), dtype=np.int32)
        self.keys = np.empty((n_features, n), dtype=np.int64)
        self.words = np.empty((layers, n, n_words), dtype=np.uint64)
        self.bits = np.empty((layers, n, n_words), dtype=np.uint64)
        self.values = np.empty((layers, n, n_words), dtype=np.float64)
        # The mask that keeps a word's second tree, per row (so that the AND is one contiguous pass).
        self.second = np.empty((n, n_words), dtype=np.uint64)
        self.second[:] = forest._second
        # Each (layer, word) index into the leaf table: its base (a multiple of 256) in the upper bytes,
        # written once, and the leaf's bit count in the lowest byte, written by each prediction.
        self.leaf_index = np.empty((layers, n, n_words), dtype=np.int64)
        self.leaf_index[:] = forest._leaf_bases[:, None, :]
        self.leaf_low_bytes = self.leaf_index.view(np.uint8)[:, :, _LOW_BYTE::8]
        self.nbytes = (
            sum(
                a.nbytes
                for a in (
                    self.transposed,
                    self.scratch,
                    self.keys,
                    self.words,
                    self.bits,
                    self.values,
                    self.second,
                )
            )
            + self.leaf_index.nbytes
        )


class CompiledForest:
    """Predicts the raw margin (base score + Σ leaf values) of a regression booster."""

    __slots__ = (
        "_active",
        "_base",
        "_buffers",
        "_keys",
        "_leaf_bases",
        "_leaf_values",
        "_lock",
        "_prefix",
        "_second",
        "_tables",
        "_thresholds",
        "n_features",
        "n_layers",
        "n_trees",
        "n_words",
    )

    def __init__(
        self,
        thresholds: list[np.ndarray],
        tables: list[np.ndarray],
        leaf_values: np.ndarray,
        second: np.ndarray,
        base: float,
        n_trees: int,
    ) -> None:
        """``thresholds[f]``: feature f's split thresholds (float32, ascending, unique); ``tables[f]``: the
        ``(len(thresholds[f]) + 1, n_words)`` AND-table of its masks; ``leaf_values``: ``(layers, n_words,
        64)``, the value of each leaf bit of each word's first (layer 0) and second (layer 1) tree;
        ``second``: per word, the mask of its second tree's bits (0 for a word holding one tree)."""
        self.n_features = len(thresholds)
        self.n_layers, self.n_words = leaf_values.shape[:2]
        self.n_trees = n_trees
        self._thresholds = thresholds
        # All features' thresholds in one sorted array of int64 keys, so that one ``searchsorted`` places
        # every value: feature f's block starts with a sentinel below any of its values, then
        # (f << 32) + the int32 key of each threshold; blocks ascend with f.
        blocks = []
        for f, values in enumerate(thresholds):
            block = np.empty(len(values) + 1, dtype=np.int64)
            block[0] = (f << 32) - (1 << 31)
            block[1:] = (f << 32) + _float_keys(values).astype(np.int64)
            blocks.append(block)
        self._keys = np.concatenate(blocks)
        self._prefix = (np.arange(self.n_features, dtype=np.int64) << 32)[:, None]
        # searchsorted lands one past the block's sentinel: a leading all-ones row aligns the tables with it.
        self._tables = np.concatenate([np.full((1, self.n_words), _FULL, dtype=np.uint64), *tables])
        # Features no tree splits on leave every mask whole: skip them.
        self._active = tuple(f for f, values in enumerate(thresholds) if len(values))
        # Value of bit k of (layer, word) at (layer × n_words + word) × 256 + popcount(bits up to k), i.e.
        # + k + 1. A word without a second tree reads 0 at + 64 (its layer-1 bits are all clear).
        table = np.zeros((self.n_layers * self.n_words, _LEAF_STRIDE), dtype=np.float64)
        table[:, 1 : _MAX_LEAVES + 1] = leaf_values.reshape(-1, _MAX_LEAVES)
        self._leaf_values = table.ravel()
        self._leaf_bases = (np.arange(self.n_layers * self.n_words, dtype=np.int64) * _LEAF_STRIDE).reshape(
            self.n_layers, self.n_words
        )
        self._second = np.ascontiguousarray(second, dtype=np.uint64)
        self._base = base
        self._lock = threading.Lock()
        self._buffers: dict[int, _Buffers] = {}  # by row count, oldest first

    @classmethod
    def from_booster(cls, booster: xgb.Booster, n_features: int) -> CompiledForest | None:
        """Compile ``booster``; None if the model is outside what this evaluator covers or disagrees."""
        try:
            forest = cls._compile(json.loads(booster.save_raw("json")), n_features)
        except (KeyError, ValueError, TypeError, IndexError):
            return None
        if forest is None or not forest._agrees_with(booster):
            return None
        return forest

    @classmethod
    def _compile(cls, model: dict[str, Any], n_features: int) -> CompiledForest | None:
        learner = model["learner"]
        params = learner["learner_model_param"]
        if int(params.get("num_target", "1")) != 1 or int(params.get("num_class", "0")) > 1:
            return None
        booster = learner["gradient_booster"]
        if booster.get("name") != "gbtree":
            return None
        base_text = str(params["base_score"])
        base_values = json.loads(base_text) if base_text.startswith("[") else [float(base_text)]
        if len(base_values) != 1:
            return None
        trees = booster["model"]["trees"]
        if not trees:
            return None
        tree_leaves: list[list[float]] = []
        tree_nodes: list[list[tuple[int, float, int]]] = []
        for tree in trees:
            if any(int(v) != 0 for v in tree.get("split_type", [])) or tree.get("categories_nodes"):
                return None
            collected = _collect(tree, n_features)
            if collected is None:
                return None
            tree_leaves.append(collected[0])
            tree_nodes.append(collected[1])
        words = _pair([len(leaves) for leaves in tree_leaves])
        n_words = len(words)
        n_layers = max(len(word) for word in words)
        leaf_values = np.zeros((n_layers, n_words, _MAX_LEAVES), dtype=np.float64)
        second = np.zeros(n_words, dtype=np.uint64)
        nodes: list[list[tuple[float, int, int]]] = [[] for _ in range(n_features)]
        for w, word in enumerate(words):
            start = 0
            for layer, t in enumerate(word):
                leaves = tree_leaves[t]
                leaf_values[layer, w, start : start + len(leaves)] = leaves
                for feature, threshold, left in tree_nodes[t]:
                    nodes[feature].append((threshold, w, _FULL ^ (left << start)))
                if layer == 1:
                    second[w] = _FULL ^ ((1 << start) - 1)
                start += len(leaves)
        thresholds: list[np.ndarray] = []
        tables: list[np.ndarray] = []
        for feature_nodes in nodes:
            feature_nodes.sort(key=lambda node: node[0])
            values = np.unique(np.array([node[0] for node in feature_nodes], dtype=np.float32))
            table = np.full((len(values) + 1, n_words), _FULL, dtype=np.uint64)
            current = [_FULL] * n_words
            i = 0
            for k, value in enumerate(values.tolist()):
                while i < len(feature_nodes) and np.float32(feature_nodes[i][0]) == value:
                    _, word_index, mask = feature_nodes[i]
                    current[word_index] &= mask
                    i += 1
                table[k + 1] = current
            thresholds.append(values)
            tables.append(table)
        return cls(thresholds, tables, leaf_values, second, float(base_values[0]), len(trees))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Margins (float64, a new array) for the float32 rows of ``X`` (``(n, n_features)``, finite)."""
        n = X.shape[0]
        if n == 0:
            return np.zeros(0, dtype=np.float64)
        if n > _CHUNK_ROWS:  # bounded work arrays (and cache-sized passes) for large batches
            return np.concatenate([self.predict(X[i : i + _CHUNK_ROWS]) for i in range(0, n, _CHUNK_ROWS)])
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
        # Row of each (feature, row) in the stacked tables.
        positions = self._keys.searchsorted(b.keys.ravel(), side="right").reshape(b.keys.shape)
        masks, work, tables = b.words[0], b.bits[0], self._tables
        active = self._active
        if active:
            # Gather one feature's masks at a time and AND them in: the working set stays in cache.
            tables.take(positions[active[0]], axis=0, out=masks, mode="clip")
            for f in active[1:]:
                tables.take(positions[f], axis=0, out=work, mode="clip")
                masks &= work
        else:
            masks.fill(_FULL)
        # Layer 0 is each word as it is (its first tree's exit leaf is the lowest set bit); layer 1 keeps
        # only the second tree's bits.
        if self.n_layers == 2:
            np.bitwise_and(masks, b.second, out=b.words[1])
        # Bits up to and including the lowest set one, counted into the low byte of each leaf index.
        np.subtract(b.words, _ONE, out=b.bits)
        b.bits ^= b.words
        np.bitwise_count(b.bits, out=b.leaf_low_bytes)
        values = self._leaf_values.take(b.leaf_index, out=b.values, mode="clip")
        if self.n_layers == 2:
            np.add(values[0], values[1], out=values[0])
        out = np.add.reduce(values[0], axis=1)
        out += self._base
        return out

    def _agrees_with(self, booster: xgb.Booster) -> bool:
        """Compare with XGBoost on probe rows that straddle every threshold."""
        rng = np.random.default_rng(0)
        rows = 512
        X = np.empty((rows, self.n_features), dtype=np.float32)
        for f, thresholds in enumerate(self._thresholds):
            if len(thresholds) == 0:
                X[:, f] = 0.0
                continue
            picks = thresholds[rng.integers(0, len(thresholds), rows)]
            # at, just below and just above a threshold
            nudged = np.where(
                rng.random(rows) < 0.5,
                np.nextafter(picks, np.float32(-np.inf)),
                np.nextafter(picks, np.float32(np.inf)),
            )
            X[:, f] = np.where(rng.random(rows) < 0.3, picks, nudged).astype(np.float32)
        X = np.abs(X)  # the schema's features are non-negative
        expected = booster.inplace_predict(X, validate_features=False).astype(np.float64)
        got = self.predict(X)
        return bool(np.all(np.abs(got - expected) <= 1e-4 * (1.0 + np.abs(expected))))


def _collect(
    tree: dict[str, Any], n_features: int
) -> tuple[list[float], list[tuple[int, float, int]]] | None:
    """The leaf values of ``tree`` left to right, and each split's (feature, threshold, left-subtree leaves
    as a bit mask); None if the tree is outside what this evaluator covers."""
    left, right = tree["left_children"], tree["right_children"]
    split_index, split_cond = tree["split_indices"], tree["split_conditions"]
    leaves: list[float] = []
    splits: list[tuple[int, float, int]] = []
    # Iterative in-order walk; each frame: (node, phase, first leaf of the node's subtree).
    stack: list[tuple[int, int, int]] = [(0, 0, 0)]
    while stack:
        node, phase, lo = stack.pop()
        if left[node] == -1:
            if len(leaves) >= _MAX_LEAVES:
                return None
            leaves.append(float(split_cond[node]))
            continue
        if phase == 0:
            stack.append((node, 1, len(leaves)))
            stack.append((left[node], 0, len(leaves)))
        else:
            feature = int(split_index[node])
            if not 0 <= feature < n_features:
                return None
            left_mask = ((1 << len(leaves)) - 1) ^ ((1 << lo) - 1)  # leaves [lo, here): the left subtree
            splits.append((feature, float(np.float32(split_cond[node])), left_mask))
            stack.append((right[node], 0, len(leaves)))
    return leaves, splits


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
