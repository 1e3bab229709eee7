"""Everything a run builds from its config before training: data, sampler, method, state."""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jdml.backends import resolve_backends
from jdml.build import build_program
from jdml.cohort.members import member_configs
from jdml.config import validate
from jdml.data.arrays import ImageSet
from jdml.data.augment import make_augmentation
from jdml.data.benchmarks.common import FileList
from jdml.data.benchmarks.images import check_complete
from jdml.data.device_pixels import DeviceViews, device_views, views_place
from jdml.data.loading import load_splits
from jdml.data.pipeline import TrainBatch, host_cores, training_photos
from jdml.errors import ConfigError
from jdml.evaluation.splits import Evaluation, embed_split, evaluate_splits, split_metrics
from jdml.models.embedding import frozen_backbone_modules
from jdml.optim import check_no_decay, param_names
from jdml.platform import platform
from jdml.program import StepFn
from jdml.samplers import SAMPLERS
from jdml.samplers.memory import empty_sampler_state
from jdml.state import TrainState

log = logging.getLogger("jdml")


class Run:
    """Everything built from a config before the loop: data, sampler, method, optimiser, state.

    Shared by training and by checkpoint evaluation (which needs the same state structure).
    """

    def __init__(
        self, config: ml_collections.ConfigDict, *, validated: bool = False, abstract: bool = False
    ) -> None:
        """Builds the run of ``config``; ``validated``: the caller has just validated it (the
        trainer does, before it touches the workdir), so it is not checked twice; ``abstract``:
        the initial state's shapes only (``jax.ShapeDtypeStruct``s: nothing is computed, as
        when the step is lowered for another platform, :mod:`jdml.lowering`)."""
        if not validated:
            validate(config)
        self.config = config
        self.splits = load_splits(config.data)
        train = self.splits["train"]
        if len(train) < config.train.batch_size:
            raise ConfigError(
                f"the training split has {len(train)} images, fewer than train.batch_size="
                f"{config.train.batch_size}; lower the batch size or add data"
            )
        sampler_cls = SAMPLERS.get(config.sampler.name)
        self.sampler = sampler_cls(
            train.labels,
            batch_size=config.train.batch_size,
            samples_per_class=config.sampler.samples_per_class,
            seed=config.seed,
            **config.sampler[config.sampler.name].to_dict(),
        )
        self.steps_per_epoch = config.train.steps_per_epoch or self.sampler.steps_per_epoch
        self.total_steps = config.train.epochs * self.steps_per_epoch
        self.augment = make_augmentation(config.data)
        self.views_place = views_place(config.data, train, platform())
        # One member of the method, or a DM2 cohort (cohort.size > 1) of several.
        # What the run computes with, chosen once: backends.*, else $JDML_CONV/KNN/KMEANS.
        self.backends = resolve_backends(config.get("backends"))
        self.program = build_program(config, train.num_classes, self.steps_per_epoch, self.backends)
        self.method = self.program.method
        self.head = self.program.head
        self.drawn_members = self.program.members_drawn()
        self.tx = self.program.optimizer(self.steps_per_epoch, self.total_steps)
        # Two images shape the parameters as well as a batch does (the state is identical);
        # a whole batch would cost eager forward passes: 49 s instead of 17 s for ResNet-50
        # on 2 CPU cores, plus decoding its photos.
        sample = train.eval_images(np.arange(min(2, config.train.batch_size)))
        placeholders = empty_sampler_state(
            self.sampler,
            num_train=len(train),
            dim=self.method.heads[self.method.head],
            steps_per_epoch=self.steps_per_epoch,
        )
        init = functools.partial(self.program.init_state, self.tx, config.seed)
        if abstract:
            self.initial_state = jax.eval_shape(init, sample, placeholders)
        else:
            self.initial_state = init(sample, placeholders)
        self.embed_fn = self.program.make_embed_fn()
        self.eval_config = self.program.embeddings.eval_config

    def check_parameter_names(self) -> None:
        """Before a run writes anything: every parameter a config value names exists in the
        built model (:func:`check_parameter_names`)."""
        check_parameter_names(self.config, self.initial_state.params)

    def check_photos(self) -> None:
        """Before a run writes anything: every photo file of every split ends as a complete
        file (a truncated one is named, :func:`jdml.data.benchmarks.images.check_complete`),
        and with ``data.decode_cache`` the training split's cache is opened, built if needed
        (a photo that does not decode, or a cache folder that cannot be written, is named now
        rather than at the first batch)."""
        for split in self.splits.values():
            if isinstance(split, FileList):
                check_complete(split.paths, host_cores())
        training_photos(self.splits["train"], self.config.data)

    @functools.cached_property
    def device_views(self) -> DeviceViews | None:
        """The run's device views (``data.views``), built when training first asks for them (an
        evaluation never does: it holds no training photos on the device)."""
        if self.views_place != "device":
            return None
        return device_views(
            self.config.data,
            training_photos(self.splits["train"], self.config.data),
            self.program.placement.mesh,
        )

    def batch_maker(self, sampler: Any = None) -> TrainBatch:
        """The run's training batches as a function of the step: its split, sampler (or
        ``sampler``, e.g. the epoch's memory-aware one), augmentation and seed, the views and
        streams its method reads, the members' views and this process's rows."""
        return TrainBatch(
            data=self.splits["train"],
            sampler=self.sampler if sampler is None else sampler,
            augment=self.augment,
            seed=self.config.seed,
            views=self.method.views,
            streams=self.method.streams,
            members=self.drawn_members,
            rows=self.program.placement.rows,
            views_on_device=self.device_views.host if self.device_views else None,
        )

    def make_train_step(self) -> StepFn:
        """The jitted, state-donating train step of the program."""
        return self.program.make_train_step(self.tx, self.initial_state, self.device_views)

    def prepare(self, state: TrainState) -> TrainState:
        """Before the first step: fills the sampler's embedding memory, then each term prefills
        its state (DaNCE: its key queue)."""
        return self.prefill_terms(self.fill_memory(state))

    def prefill_terms(self, state: TrainState) -> TrainState:
        """Each term with a state prepares it (``Term.prefill``) from augmented training images
        drawn with a fixed seed and the program's per-member functions."""
        if not any(name in state.method_state for name in self.method.terms):
            return state  # no stateful term (a heterogeneous cohort has none)
        new = dict(state.method_state)
        for name, term in self.method.terms.items():
            if name in state.method_state:
                log.info("Preparing the state of term %s", name)
                new[name] = term.prefill(state.method_state[name], state.batch_stats, self)
        return state.replace(method_state=new)

    def key_functions(self, head: str) -> tuple[Callable, Callable]:
        """For ``Term.prefill``: the program's key functions (``Program.key_functions``)."""
        return self.program.key_functions(head)

    def embed_training_images(
        self, count: int, embed: Callable[[np.ndarray], Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        """For ``Term.prefill``: ``embed`` over ``count`` augmented training images in eval
        batches, drawn with a fixed seed (with replacement when the split has fewer); the outputs
        concatenated on their second-to-last axis (a cohort's are ``(L, B, dim)``), and the
        labels."""
        train = self.splits["train"]
        rng = np.random.default_rng((self.config.seed, 3))
        idx = rng.choice(len(train), count, replace=count > len(train))
        outputs = []
        bs = self.config.eval.batch_size
        for start in range(0, len(idx), bs):
            chunk = idx[start : start + bs]
            images = self.augment(train.load(chunk), rng).astype(np.float32)
            outputs.append(np.asarray(embed(images)))
        return np.concatenate(outputs, axis=-2), np.asarray(train.labels[idx], np.int32)

    def fill_memory(self, state: TrainState) -> TrainState:
        """Fills the samplers' embedding memory with eval-mode training-set embeddings."""
        if "memory" not in state.sampler_state:
            return state
        log.info("Embedding the training set for the %s sampler", self.config.sampler.name)
        emb = embed_split(
            self.embed_fn,
            state.params,
            state.batch_stats,
            self.splits["train"],
            self.config.eval.batch_size,
        )[self.head]
        return state.replace(sampler_state={**state.sampler_state, "memory": jnp.asarray(emb)})

    def evaluate(
        self,
        state: TrainState,
        splits: dict[str, ImageSet],
        full: Sequence[str] | None = None,
        on_embeddings: Callable[[str, ImageSet, np.ndarray], None] | None = None,
    ) -> Evaluation:
        """Evaluates ``state`` on ``splits`` (:class:`jdml.evaluation.splits.Evaluation`: the
        evaluated head's metrics and vectors, and the other heads' and combinations' metrics).

        The splits in ``full`` (default: all) get ``eval.metrics`` and the multi-head evaluation;
        the training split also ``eval.train_metrics`` (see
        ``jdml.evaluation.splits.split_metrics``). ``on_embeddings(split, data, embeddings)``
        sees the evaluated head's embeddings of the splits in ``full``.
        """
        full = list(splits) if full is None else full
        return evaluate_splits(
            self.embed_fn,
            state.params,
            state.batch_stats,
            splits,
            split_metrics(self.eval_config, list(splits), full),
            self.eval_config,
            head=self.head,
            seed=self.config.seed,
            full=full,
            devices=int(self.config.parallel.eval_devices),
            on_embeddings=on_embeddings,
            backends=self.backends,
        )


def check_parameter_names(config: ml_collections.ConfigDict, params: Any) -> None:
    """Every name of a parameter that ``config`` gives matches a dict key on the paths of
    ``params`` (the built model's): the names of ``optim.no_decay``
    (:func:`jdml.optim.check_no_decay`) and the backbone modules that ``model.frozen_stages``
    freezes (each member's, in a heterogeneous cohort). A name that matches nothing would
    change nothing, silently.

    Raises:
      ConfigError: naming the value, the nearest parameter names and a value that works.
    """
    check_no_decay(config.optim, params)
    names = param_names(params)
    members = member_configs(config) if config.cohort.members else [config]
    for member in members:
        frozen = frozen_backbone_modules(member.model)
        missing = sorted(frozen - names)
        if missing:
            nearest = difflib.get_close_matches(missing[0], names, n=3, cutoff=0.0)
            raise ConfigError(
                f"model.frozen_stages={member.model.frozen_stages} freezes backbone modules "
                f"{', '.join(missing)} of {member.model.backbone!r}, which its parameters do not "
                f"have (the nearest: {', '.join(nearest)}); use "
                "--config.model.frozen_stages=-1 (the backbone declares stages it does not build)"
            )
