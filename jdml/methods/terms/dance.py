"""DiVA's DaNCE term: online queries, EMA-network keys and a FIFO queue of past keys.

Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric Learning", ECCV
2020, Sec. 3 (DaNCE); the loss itself is ``jdml.losses.dance``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from jdml.errors import ConfigError
from jdml.losses.dance import dance_loss
from jdml.methods.ema_queue import KeyQueue, ema_update, push, valid_mask
from jdml.methods.terms.base import TERMS, Metrics, PrefillSource, Term, TermInputs
from jdml.registry import COUNT, NON_NEGATIVE, POSITIVE, Range


@TERMS.register(
    "dance",
    ranges={
        "dim": Range(0, integer=True),
        "weight": NON_NEGATIVE,
        "temperature": POSITIVE,
        "momentum": Range(0, 1),
        "queue_batches": COUNT,
        "lower_cutoff": NON_NEGATIVE,
        "upper_cutoff": POSITIVE,
    },
)
class DanceTerm(Term):
    """DiVA's DaNCE on one head: online queries on view a, EMA-network keys on view b, and a
    FIFO queue of past keys as negatives (see ``jdml.losses.dance``).

    The EMA key parameters and the queue live in the train state (``method_state[<term>]``) and
    are updated inside the jitted step after the optimiser update.
    """

    views = 2
    stateful = True

    def __init__(self, cfg: ml_collections.ConfigDict, *, batch_size: int, dim: int) -> None:
        self.head, self.weight = cfg.head, float(cfg.weight)
        self.cfg = cfg
        self.queue_size = int(cfg.queue_batches) * batch_size
        self.dim = dim
        if self.queue_size < batch_size:
            raise ValueError(f"DaNCE queue_batches must be >= 1, got {cfg.queue_batches}")

    @classmethod
    def section(
        cls, *, head: str = "selfsimilarity", weight: float, dim: int = 0
    ) -> ml_collections.ConfigDict:
        """A DaNCE term's section, with its EMA key network and queue.

        Keys: ``temperature`` (the paper's runs 0.01), ``momentum`` of the EMA key parameters
        (0.9), ``queue_batches`` (the queue holds that many batches of keys, filled by the
        initial key network before training: the reference's n_key_batches), the distance-weight
        cut-offs, the weight normalisation (``anchor``: each anchor's weights sum to 1, the
        paper's intent; ``batch``: the reference's default code) and ``weighting`` (False: plain
        MoCo InfoNCE).
        """
        t = ml_collections.ConfigDict()
        t.kind = "dance"
        t.head = head
        t.dim = dim
        t.weight = weight
        t.temperature = 0.01
        t.momentum = 0.9
        t.queue_batches = 30
        t.lower_cutoff = 0.5
        t.upper_cutoff = ml_collections.FieldReference(1.4, field_type=object)
        t.normalize = "anchor"
        t.weighting = True
        return t

    @classmethod
    def validate(cls, where: str, cfg: ml_collections.ConfigDict) -> None:
        if cfg.normalize not in ("anchor", "batch"):
            raise ConfigError(f"{where}.normalize={cfg.normalize!r}; choose anchor or batch")

    @classmethod
    def build(
        cls, cfg: ml_collections.ConfigDict, *, num_classes: int, batch_size: int, dim: int
    ) -> DanceTerm:
        return cls(cfg, batch_size=batch_size, dim=dim)

    def init_state(self, model_params: Any) -> dict[str, Any]:
        """EMA key parameters (a copy of the online ones) and an empty key queue."""
        return {
            "ema": jax.tree.map(jnp.array, model_params),
            "queue": KeyQueue.create(self.queue_size, self.dim),
        }

    def apply(self, params: Any, inputs: TermInputs) -> tuple[jax.Array, Metrics, Any]:
        """The loss of the online queries against the keys of the EMA network on the second
        view (train-mode normalisation, no gradient); the keys then enter the queue."""
        images = inputs.batch.get("images_b", inputs.batch["images"])
        keys = jax.lax.stop_gradient(inputs.network(inputs.state["ema"], images)[self.head])
        value, metrics = self(inputs.out[self.head], keys, inputs.state)
        return value, metrics, {"keys": keys}

    def update_state(
        self, state: dict[str, Any], model_params: Any, output: Any, labels: jax.Array
    ) -> dict[str, Any]:
        """The EMA of the key params, then the batch's keys enter the queue."""
        ema = ema_update(state["ema"], model_params, self.cfg.momentum)
        return {"ema": ema, "queue": push(state["queue"], output["keys"], labels)}

    def prefill(self, state: Any, batch_stats: Any, source: PrefillSource) -> Any:
        """Fills the queue with keys of the initial key network, in eval mode, on augmented
        training images (the reference's n_key_batches)."""
        embed_keys, push_keys = source.key_functions(self.head)
        keys, labels = source.embed_training_images(
            self.queue_size, lambda images: embed_keys(state["ema"], batch_stats, images)
        )
        return {**state, "queue": push_keys(state["queue"], keys, labels)}

    def __call__(
        self, queries: jax.Array, keys: jax.Array, state: dict[str, Any]
    ) -> tuple[jax.Array, Metrics]:
        queue: KeyQueue = state["queue"]
        loss, metrics = dance_loss(
            queries,
            jax.lax.stop_gradient(keys),
            queue.keys,
            temperature=self.cfg.temperature,
            lower_cutoff=self.cfg.lower_cutoff,
            upper_cutoff=self.cfg.upper_cutoff,
            normalize=self.cfg.normalize,
            weighting=self.cfg.weighting,
            queue_valid=valid_mask(queue),
        )
        return loss, {**metrics, "loss": loss}
