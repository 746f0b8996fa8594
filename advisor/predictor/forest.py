"""LightGBM trees as flat arrays, checked and evaluated in numpy: no native parser sees a file.

A tree is seven arrays over its nodes (`feature`, `threshold`, `left`, `right`, `default_left`,
`nan_as`, `value`); a leaf has feature -1. A node's children always come after it and every node but the root has exactly one parent, so a
walk always ends at a leaf; `check_trees` also bounds a tree's size and depth, a member's tree
count and the padded arrays evaluation builds, so a crafted file can make neither a long walk nor
a huge allocation. `Forest` stacks a member's trees
into padded 2-D arrays once and moves every row down every tree together, one level per step.
"""

from __future__ import annotations

import numpy as np

from capacity_advisor.core.numbers import number, whole

KEYS = ("feature", "threshold", "left", "right", "default_left", "nan_as", "value")
MAX_NODES = 4095  # per tree (advisor fit grows trees of at most 7 nodes)
MAX_DEPTH = 64
MAX_TREES = 20_000  # per member
MAX_TOTAL_NODES = 2_000_000  # per member
MAX_PADDED = 2_000_000  # per member: trees x the widest tree's nodes (what evaluation allocates)


def tree_arrays(root: dict) -> dict:
    """A LightGBM tree (its JSON dump) as flat arrays, children always after their parent."""
    t = {k: [] for k in KEYS}

    def add(node: dict) -> int:
        i = len(t["feature"])
        for k in t:
            t[k].append(0)
        if "leaf_value" in node or "split_feature" not in node:
            t["feature"][i], t["value"][i], t["left"][i], t["right"][i] = -1, float(node.get("leaf_value", 0.0)), -1, -1
            return i
        if node.get("decision_type", "<=") != "<=":
            raise ValueError("categorical splits are not used by this predictor")
        t["feature"][i] = int(node["split_feature"])
        t["threshold"][i] = float(node["threshold"])
        t["default_left"][i] = int(bool(node.get("default_left", True)))
        # how a missing value is routed: NaN -> default side; None -> treated as 0.0; Zero -> 0 and NaN default side
        t["nan_as"][i] = {"NaN": 0, "None": 1, "Zero": 2}.get(node.get("missing_type", "None"), 1)
        t["left"][i] = add(node["left_child"])
        t["right"][i] = add(node["right_child"])
        return i

    add(root)
    return t


def _finite_floats(x, n: int) -> bool:
    return (isinstance(x, list) and len(x) == n
            and all(number(v) for v in x)
            and bool(np.isfinite(np.asarray(x, dtype=float)).all()))


def check_trees(trees, n_features: int, per_round: int) -> str | None:
    """What is wrong with a member's trees, or None."""
    if not isinstance(trees, list) or not trees or len(trees) % per_round:
        return "tree count"
    if len(trees) > MAX_TREES:
        return f"more than {MAX_TREES:,} trees"
    total = widest = 0
    for t in trees:
        if not isinstance(t, dict):
            return "tree"
        feature = t.get("feature")
        n = len(feature) if isinstance(feature, list) else 0
        if n == 0 or not all(isinstance(t.get(k), list) and len(t[k]) == n for k in KEYS):
            return "tree arrays"
        if n > MAX_NODES:
            return f"a tree of more than {MAX_NODES:,} nodes"
        total += n
        widest = max(widest, n)
        if total > MAX_TOTAL_NODES or widest * len(trees) > MAX_PADDED:
            return f"more than {MAX_TOTAL_NODES:,} tree nodes"
        if not (_finite_floats(t["threshold"], n) and _finite_floats(t["value"], n)):
            return "tree values"
        depth = [0] * n
        parents = [0] * n
        for i in range(n):
            f, lft, rgt = t["feature"][i], t["left"][i], t["right"][i]
            if not all(whole(v) for v in (f, lft, rgt, t["nan_as"][i], t["default_left"][i])):
                return "tree indices"
            if f == -1:
                continue
            if not (0 <= f < n_features and i < lft < n and i < rgt < n and lft != rgt and t["nan_as"][i] in (0, 1, 2)
                    and t["default_left"][i] in (0, 1)):
                return "tree structure"
            parents[lft] += 1
            parents[rgt] += 1
            depth[lft] = depth[rgt] = depth[i] + 1
            if depth[i] + 1 > MAX_DEPTH:
                return f"a tree deeper than {MAX_DEPTH} levels"
        if parents[0] != 0 or any(p != 1 for p in parents[1:]):
            return "tree structure (every node but the root needs exactly one parent)"
    return None


class Forest:
    """A member's trees stacked for evaluation: `raw(X)` is each tree's leaf value per row."""

    def __init__(self, trees: list[dict]):
        width = max(len(t["feature"]) for t in trees)

        def stack(key, dtype, fill):
            out = np.full((len(trees), width), fill, dtype=dtype)
            for i, t in enumerate(trees):
                out[i, :len(t[key])] = t[key]
            return out

        self.feature = stack("feature", np.int64, -1)
        self.threshold = stack("threshold", float, 0.0)
        self.left = stack("left", np.int64, -1)
        self.right = stack("right", np.int64, -1)
        self.default_left = stack("default_left", np.int64, 0) == 1
        self.nan_as = stack("nan_as", np.int64, 1)
        self.value = stack("value", float, 0.0)
        self.depth = self._depth()

    def _depth(self) -> int:
        """The deepest leaf (children come after their parent, so one forward pass finds it)."""
        depth = np.zeros_like(self.feature)
        for i in range(self.feature.shape[1]):
            inner = self.feature[:, i] >= 0
            rows = np.nonzero(inner)[0]
            depth[rows, self.left[rows, i]] = depth[rows, i] + 1
            depth[rows, self.right[rows, i]] = depth[rows, i] + 1
        return int(depth.max())

    def raw(self, X: np.ndarray) -> np.ndarray:
        """(trees, rows) leaf values."""
        n_trees, n_rows = self.feature.shape[0], len(X)
        node = np.zeros((n_trees, n_rows), dtype=np.int64)
        t = np.arange(n_trees)[:, None]
        for _ in range(self.depth):
            f = self.feature[t, node]
            inner = f >= 0
            if not inner.any():
                break
            x = X[np.arange(n_rows)[None, :], np.where(inner, f, 0)]
            nan_as = self.nan_as[t, node]
            missing = np.isnan(x) | ((nan_as == 2) & (x == 0))
            x = np.where(np.isnan(x) & (nan_as == 1), 0.0, x)
            missing &= nan_as != 1
            go_left = np.where(missing, self.default_left[t, node], x <= self.threshold[t, node])
            step = np.where(go_left, self.left[t, node], self.right[t, node])
            node = np.where(inner, step, node)
        return self.value[t, node]
