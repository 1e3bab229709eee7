"""Baselines without training, which a claim may compare a trained row with.

*Revisiting Training Strategies* (Roth et al., ICML 2020), Tab. 1, sets fine-tuning against
what it starts from. :data:`FIXED` names the two baselines a :class:`jdml.study.Claim` can
give as ``fixed``:

* ``"pixels"``: every test image's pixels, flattened and L2-normalised;
* ``"features"``: the pretrained backbone's pooled features (``model.pretrained`` of the
  claim's row, before any head), L2-normalised.

Each is evaluated once on the test classes, as the trained rows' selected checkpoints are, and
kept in ``DIR/baselines.json`` (``{"commit": ..., "fixed": {name: {"label": ..., metric:
value}}}``): a claim against it has one value on that side, the same for every seed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jdml.fileio import atomic_write

#: name -> what it is (the report's label starts with it).
FIXED = {"pixels": "raw pixels", "features": "pretrained features"}
FILE = "baselines.json"


def path(directory: str) -> str:
    return os.path.join(directory, FILE)


def read(directory: str) -> dict[str, dict[str, Any]]:
    """The fixed baselines recorded in ``directory`` (name -> label and metrics); none: {}.

    Raises:
      ValueError: the file is damaged, naming it and the fix.
    """
    try:
        with open(path(directory)) as f:
            found = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path(directory)} is unreadable ({e}); move it away and run the study again to "
            "evaluate the fixed baselines anew"
        ) from None
    if not isinstance(found, dict) or not isinstance(found.get("fixed"), dict):
        raise ValueError(f"{path(directory)} has no 'fixed' table; move it away and run again")
    return found["fixed"]


def _normalised(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32).reshape(len(x), -1)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def pooled_features(config: Any, images: np.ndarray, batch: int = 256) -> np.ndarray:
    """The backbone's pooled features of ``images`` (float32 in [0, 1], NHWC) with the weights
    of ``model.pretrained``, normalised as the config's runs normalise their input."""
    import jax

    from jdml.backends import resolve_backends
    from jdml.embedder import input_normalization
    from jdml.models.embedding import build_model
    from jdml.models.pretrained.backbones import load_backbone

    native_conv = resolve_backends(config.get("backends")).native_conv
    model = build_model(config.model, train=False, native_conv=native_conv)
    mean, std = input_normalization(config)
    variables = model.init(jax.random.PRNGKey(0), (images[:1] - mean) / std)
    variables = load_backbone(config.model.backbone, config.model.pretrained)(variables)
    backbone = {k: v["backbone"] for k, v in variables.items() if "backbone" in v}
    apply = jax.jit(lambda v, x: model.backbone.apply(v, (x - mean) / std))
    starts = range(0, len(images), batch)
    parts = [np.asarray(apply(backbone, images[i : i + batch])) for i in starts]
    return np.concatenate(parts)


def evaluate(config: Any, names: Sequence[str], metrics: Sequence[str]) -> dict[str, dict]:
    """Each fixed baseline of ``names`` on the test classes of ``config``'s data."""
    from jdml.data.loading import load_splits
    from jdml.evaluation.embeddings import evaluate_embeddings

    if "features" in names and not config.model.pretrained:
        raise ValueError(
            f"fixed='features' reads the pretrained features of backbone "
            f"{config.model.backbone!r}, but the claim's row sets no model.pretrained; give it "
            "the weights (e.g. model.pretrained=packaged) or compare with fixed='pixels'"
        )
    test = load_splits(config.data)["test"]
    images = test.eval_images(np.arange(len(test)))
    out = {}
    for name in names:
        if name == "pixels":
            x = images
            label = f"raw pixels ({' x '.join(map(str, images.shape[1:]))}, L2-normalised)"
        else:
            x = pooled_features(config, images)
            label = (
                f"pretrained features ({config.model.backbone} {config.model.pretrained}, "
                f"pooled {x.shape[1]}-d, L2-normalised)"
            )
        found = evaluate_embeddings(_normalised(x), test.labels, list(metrics), seed=0)
        out[name] = {"label": label, **{m: float(found[m]) for m in metrics}}
    return out


def ensure(
    directory: str, config: Any, names: Sequence[str], metrics: Sequence[str], commit: str
) -> Mapping[str, dict]:
    """The fixed baselines of ``names``, evaluated (on ``config``'s data) and recorded in
    ``directory`` where the file lacks them."""
    found = read(directory)
    missing = [n for n in names if n not in found]
    if missing:
        found = {**found, **evaluate(config, missing, metrics)}
        payload = {"commit": commit, "fixed": found}
        atomic_write(path(directory), json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return found
