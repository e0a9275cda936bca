"""A booster's trees packed for the evaluator, ``CompiledForest`` (``slorouter.predictor.forest``).

``pack_booster`` reads the booster's JSON (``save_raw("json")``, parsed with orjson) and ``pack_trees`` turns
its node arrays into packed trees with whole-array operations: every tree's nodes are walked level by level
from the roots (no Python per node), the leaves of each tree are numbered left to right, and trees are
packed two to a 64-bit word when their leaves fit. Both return None for models the evaluator does not cover
(trees of more than 64 leaves, categorical splits, several outputs, other boosters).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import orjson
import xgboost as xgb

FULL = np.uint64((1 << 64) - 1)
ONE = np.uint64(1)
MAX_LEAVES = 64  # per tree: a tree's leaves are the bits of one word
_MAX_DEPTH = 64  # a walk deeper than this is a malformed tree (a tree of ≤ 64 leaves is at most 63 deep)


@dataclass(frozen=True, slots=True, eq=False)
class PackedTrees:
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


def pack_booster(booster: xgb.Booster, n_features: int) -> PackedTrees | None:
    """``booster``'s trees, read from its JSON; None if the model is outside what the evaluator covers."""
    try:
        return pack_trees(orjson.loads(booster.save_raw("json")), n_features)
    except (KeyError, ValueError, TypeError, IndexError, OverflowError, orjson.JSONDecodeError):
        return None


def _array(trees: list[dict[str, Any]], key: str, dtype: type) -> np.ndarray:
    return np.array(list(chain.from_iterable(tree[key] for tree in trees)), dtype=dtype)


def pack_trees(model: dict[str, Any], n_features: int) -> PackedTrees | None:
    """A booster's JSON (``save_raw("json")``) as packed trees; None if outside what the evaluator covers.

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

    levels: list[np.ndarray] = []
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
    if leaves_per_tree.max() > MAX_LEAVES:
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
            second[w] = FULL ^ np.uint64((1 << int(leaves_per_tree[word[0]])) - 1)

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
    left_bits = np.left_shift(np.left_shift(ONE, left_count) - ONE, offset)
    leaf_tree = tree_of[leaves]
    leaf_values = np.zeros((len(words) + n_pairs, MAX_LEAVES), dtype=np.float64)
    leaf_values[row_of[leaf_tree], first[leaves] + shift_of[leaf_tree]] = condition[leaves]
    return PackedTrees(
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
        if low < high and leaf_counts[order[low]] + leaf_counts[big] <= MAX_LEAVES:
            words.append([big, order[low]])
            low += 1
        else:
            words.append([big])
        high -= 1
    return words
