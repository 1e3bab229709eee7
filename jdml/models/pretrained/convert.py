"""Filling a Flax variable tree from a PyTorch-style state dict.

A converter names, for every leaf of the Flax ``params`` and ``batch_stats`` trees, the PyTorch
tensor it comes from and how its layout changes (convolution kernels OIHW -> HWIO, linear weights
(out, in) -> (in, out)). :func:`fill` walks the Flax tree that ``init`` produced, so a missing
tensor, a shape mismatch and a tensor nobody used are all caught, each with a message naming the
weight file's key and the Flax path. Every tensor the model reads must be finite floating point:
one holding NaN or inf, or integer or boolean values where the model holds floats (a quantised
int8 file), is refused, naming it, before the model is built (so before a run writes anything).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from jdml.errors import WeightFileError, WeightMismatchError
from jdml.registry import Registry

# (flax collection, path inside it) -> (torch key, transform) or None for "keep the init value".
Rule = Callable[[str, tuple[str, ...]], tuple[str, Callable[[np.ndarray], np.ndarray]] | None]


def conv_kernel(w: np.ndarray) -> np.ndarray:
    """PyTorch convolution weight (O, I/groups, kh, kw) -> Flax kernel (kh, kw, I/groups, O)."""
    return np.transpose(w, (2, 3, 1, 0))


def dense_kernel(w: np.ndarray) -> np.ndarray:
    """PyTorch linear weight (out, in) -> Flax kernel (in, out)."""
    return np.transpose(w, (1, 0))


def same(w: np.ndarray) -> np.ndarray:
    return w


BN_PARAMS = {"scale": ("weight", same), "bias": ("bias", same)}
BN_STATS = {"mean": ("running_mean", same), "var": ("running_var", same)}


def leaf_source(
    prefix: str, collection: str, leaf: str, kind: str
) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
    """The PyTorch key and transform of one leaf of a conv / dense / batch-norm module.

    Args:
      prefix: the PyTorch module name (``"_blocks.3._expand_conv"``).
      collection: ``"params"`` or ``"batch_stats"``.
      leaf: the Flax leaf name (``kernel``, ``bias``, ``scale``, ``mean``, ``var``).
      kind: ``"conv"``, ``"dense"`` or ``"bn"``.
    """
    if kind == "bn":
        name, fn = (BN_PARAMS if collection == "params" else BN_STATS)[leaf]
        return f"{prefix}.{name}", fn
    if leaf == "kernel":
        return f"{prefix}.weight", conv_kernel if kind == "conv" else dense_kernel
    return f"{prefix}.bias", same


def takes_shape(transform: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Marks a transform that fits a tensor to the model's shape: :func:`fill` calls it with the
    target shape too (``transform(raw, shape)``), e.g. to resample position embeddings made for
    another input size."""
    transform.takes_shape = True  # type: ignore[attr-defined]
    return transform


def _takes_shape(transform: Callable[..., np.ndarray]) -> bool:
    return bool(getattr(transform, "takes_shape", False))


def _paths(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterable[tuple[str, ...]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _paths(value, (*prefix, key))
        else:
            yield (*prefix, key)


def _set(tree: dict[str, Any], path: tuple[str, ...], value: np.ndarray) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _copy(tree: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


def weight_problem(raw: np.ndarray, target_dtype: Any) -> str | None:
    """Why ``raw`` cannot fill a leaf of ``target_dtype``, or None: integer or boolean values
    where the model holds floats, or NaN or inf values (counted)."""
    if not jnp.issubdtype(target_dtype, jnp.floating):
        return None
    if not jnp.issubdtype(raw.dtype, jnp.floating):
        return f"holds {raw.dtype} values where the model holds floats"
    bad = raw.size - int(np.count_nonzero(np.isfinite(raw.astype(np.float32, copy=False))))
    return f"holds {bad} NaN or inf value(s) of {raw.size}" if bad else None


def fill(
    variables: Mapping[str, Any],
    state_dict: Mapping[str, np.ndarray],
    rule: Rule,
    *,
    source: str,
    ignore: Callable[[str], bool] = lambda key: False,
) -> dict[str, Any]:
    """``variables`` (``{"params": ..., "batch_stats": ...}``) with every leaf the rule names
    replaced by the converted tensor from ``state_dict``.

    Args:
      variables: the Flax variables from ``init`` (only shapes and dtypes are used).
      state_dict: PyTorch key -> array.
      rule: maps (collection, Flax path) to the PyTorch key and transform, or None to keep the
        initial value (e.g. the new embedding heads).
      source: the weight file, for messages.
      ignore: PyTorch keys that may stay unused (BatchNorm's ``num_batches_tracked`` always may).

    Raises:
      WeightMismatchError: for missing keys, shape mismatches and unused tensors.
      WeightFileError: for a tensor the model reads that holds NaN or inf, or integer or
        boolean values where the model holds floats (:func:`weight_problem`).
    """
    out = {name: _copy(tree) for name, tree in variables.items()}
    used: set[str] = set()
    missing, wrong, damaged = [], [], []
    for collection, tree in variables.items():
        for path in _paths(tree):
            found = rule(collection, path)
            if found is None:
                continue
            key, transform = found
            flax_name = f"{collection}/{'/'.join(path)}"
            if key not in state_dict:
                missing.append(f"{key} (for {flax_name})")
                continue
            used.add(key)
            raw = np.asarray(state_dict[key])
            target = _get(tree, path)
            problem = weight_problem(raw, target.dtype)
            if problem:
                damaged.append(f"{key} (for {flax_name}) {problem}")
                continue
            try:
                fitted = _takes_shape(transform)
                value = transform(raw, tuple(target.shape)) if fitted else transform(raw)
            except ValueError as e:  # a tensor its transform cannot fit to the model
                wrong.append(f"{key} {tuple(raw.shape)} for {flax_name}: {e}")
                continue
            if tuple(value.shape) != tuple(target.shape):
                wrong.append(
                    f"{key} {tuple(raw.shape)} (as {tuple(value.shape)}) for {flax_name} "
                    f"{tuple(target.shape)}"
                )
                continue
            _set(out[collection], path, value.astype(target.dtype))
    unused = sorted(
        k
        for k in state_dict
        if k not in used and not ignore(k) and not k.endswith("num_batches_tracked")
    )
    if damaged:
        raise WeightFileError(
            f"{source}: {len(damaged)} tensor(s) are not finite float weights: "
            f"{', '.join(damaged[:6])}. The file is damaged or quantised: give the original "
            "float weights (float32, float16 or bfloat16) in model.pretrained"
        )
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing: {', '.join(missing[:6])}")
    if wrong:
        problems.append(f"{len(wrong)} of the wrong shape: {', '.join(wrong[:6])}")
    if unused:
        problems.append(f"{len(unused)} not used by the model: {', '.join(unused[:6])}")
    if problems:
        raise WeightMismatchError(
            f"{source} does not fit the model: " + "; ".join(problems) + ". Check that the file "
            "holds the weights of the configured backbone (model.backbone) and its variant"
        )
    return out


PACKAGED = "packaged"  # model.pretrained value: the weights a pip package ships


@dataclasses.dataclass(frozen=True)
class Converter:
    """How a backbone's weights are read.

    Attributes:
      rule: Flax leaf -> PyTorch key and transform (see ``jdml.models.pretrained.convert``).
      ignore: PyTorch keys the backbone does not use (e.g. the ImageNet classifier).
      packaged: the path of weights shipped by a pip package, if there is one.
      prepare: rewrites a state dict of another layout into the one ``rule`` reads (e.g.
        DINOv2's own checkpoints into timm's names), before it is filled in.
    """

    rule: Rule
    ignore: Callable[[str], bool] = lambda key: False
    packaged: Callable[[], str] | None = None
    prepare: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None


#: How each backbone with pretrained weights reads them; each converter module registers its own.
CONVERTERS: Registry[Converter] = Registry("pretrained backbone")
