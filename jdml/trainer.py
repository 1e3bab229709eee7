"""The one training loop: ``train_and_evaluate(config, workdir) -> summaries``.

It only does what every method needs: one jitted, state-donating step (value and grad of the
method's loss, the optimiser update, a non-finite guard), periodic evaluation on unseen classes,
JSON-lines metrics, latest/best checkpoints and automatic resumption from the workdir. Everything
method-specific (heads, miners, losses and their weights) lives in the method object.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from tqdm.auto import tqdm

from jdml.checkpoint import Checkpoints, has_checkpoints, saved_steps
from jdml.cli import EXIT_USAGE, from_storage_layer
from jdml.config import (
    base_config,
    flatten_config,
    incompatible_keys,
    to_json,
    validate,
)
from jdml.config.saved import resume_command, unreadable_config
from jdml.config.usage import check_unused_keys
from jdml.config.validation import check_devices, check_profile_steps, profile_range
from jdml.data.pipeline import input_pipeline, train_batches
from jdml.distributed import barrier, exit_after_peer_failure, is_main_process, peer_failure
from jdml.errors import (
    ConfigError,
    NonFiniteEmbeddingError,
    NonFiniteLossError,
    raise_if_stopped,
)
from jdml.evaluations import Evaluations
from jdml.fileio import atomic_write
from jdml.metric_writer import MetricWriter
from jdml.optim import learning_rate, lowered_rate
from jdml.program import StepFn
from jdml.run import Run
from jdml.samplers.memory import epoch_sampler
from jdml.state import TrainState
from jdml.workdir import check_name, check_writable, claim_workdir

log = logging.getLogger("jdml")

_MAX_IN_FLIGHT = 2  # train steps dispatched ahead of the last finished one


def check_workdir_config(
    config: ml_collections.ConfigDict, workdir: str, *, replace_unreadable: bool = False
) -> bool:
    """Checks that ``config`` may continue the run stored in ``workdir``; reads, writes nothing.

    A workdir whose ``config.json`` differs in keys that change the model or the training run is
    refused once it holds a checkpoint. Without one (a start that failed or was stopped before
    its first checkpoint) the new config simply replaces the old one.

    An unreadable ``config.json`` (damaged) is refused unless ``replace_unreadable``: then
    ``config``, which the caller says is the one the run was trained with, replaces it (the
    checkpoints must restore into its model, which ``Checkpoints.restore`` checks).

    Returns:
      True if the stored config differs (or is unreadable) and is to be replaced.

    Raises:
      ConfigError: if ``workdir/config.json`` is unreadable (without ``replace_unreadable``), or
        differs and a checkpoint exists (the message lists the differences and the fixes).
    """
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return False
    try:
        with open(path) as f:
            old = json.load(f)
        if not isinstance(old, dict):
            raise ValueError(f"a JSON {type(old).__name__}, not an object")
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError included
        if replace_unreadable:
            log.warning("%s is unreadable (%s); replacing it with this config", path, e)
            return True
        raise ConfigError(unreadable_config(path, e)) from None
    defaults = flatten_config(json.loads(to_json(base_config())))
    diffs = incompatible_keys(old, json.loads(to_json(config)), defaults=defaults)
    if not diffs:
        return False
    if not has_checkpoints(workdir):
        return True
    raise ConfigError(
        f"workdir {workdir} holds a run with a different config ({'; '.join(diffs)}); resuming "
        "it with this config would mix two experiments. Use a new --workdir for the new config, "
        f"or resume the old run with its stored config: {resume_command(path, workdir, old)}"
    )


def prepare_workdir(
    config: ml_collections.ConfigDict, workdir: str, *, replace_unreadable: bool = False
) -> None:
    """Creates the workdir, refusing one written by an incompatible config, and writes config.json.

    Raises:
      ConfigError: see :func:`check_workdir_config`.
    """
    replaced = check_workdir_config(config, workdir, replace_unreadable=replace_unreadable)
    os.makedirs(workdir, exist_ok=True)
    barrier("jdml:workdir-checked")  # every process has read the old config before it changes
    if is_main_process():
        if replaced and has_checkpoints(workdir):
            log.info("The unreadable config.json is replaced by this one (it fits the checkpoints)")
        elif replaced:
            log.info("The workdir holds no checkpoint: its config.json is replaced by this one")
        atomic_write(os.path.join(workdir, "config.json"), to_json(config))
    barrier("jdml:workdir-ready")


def setup_logging(workdir: str | None) -> None:
    """Logs to the console and to ``workdir/train.log`` (console lines do not break the bar;
    ``workdir=None``: the console only, until the workdir may be written).

    In a multi-process run only process 0 logs (the others print warnings and errors only).
    """

    class _TqdmHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not getattr(record, "file_only", False):  # long details: train.log only
                tqdm.write(self.format(record))

    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    handlers: list[logging.Handler] = [_TqdmHandler()]
    if not is_main_process():
        log.setLevel(logging.WARNING)
    elif workdir is not None:
        handlers.append(logging.FileHandler(os.path.join(workdir, "train.log")))
    for handler in handlers:
        handler.setFormatter(fmt)
        log.addHandler(handler)
    # The storage layer's own messages (orbax, TensorStore: a failed save's tracebacks) go to
    # train.log only; the terminal gets jdml's one line (jdml.cli.quiet_storage_layer).
    absl = logging.getLogger("absl")
    for h in [h for h in absl.handlers if getattr(h, "jdml_storage", False)]:
        absl.removeHandler(h)
        h.close()
    if is_main_process() and workdir is not None:
        storage = logging.FileHandler(os.path.join(workdir, "train.log"))
        storage.jdml_storage = True  # type: ignore[attr-defined]
        storage.setLevel(logging.WARNING)
        storage.addFilter(from_storage_layer)
        storage.setFormatter(fmt)
        absl.addHandler(storage)


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, *, replace_unreadable_config: bool = False
) -> dict[str, Any]:
    """Trains the configured method, evaluating on unseen classes; resumes from ``workdir``.

    Args:
      config: a full config (see ``jdml.config.base_config`` and ``configs/``).
      workdir: run directory: config.json, metrics.jsonl, train.log, results.json, checkpoints.
      replace_unreadable_config: a damaged ``workdir/config.json`` is replaced by ``config``
        (see :func:`check_workdir_config`) instead of refused.

    Returns:
      The run summary (also written to ``workdir/results.json``): the untrained, final and best
      evaluations per split, the selection split and metric, and the number of times the train
      step was compiled.
    """
    check_name(workdir)  # before anything is checked, read or written
    workdir = os.path.abspath(workdir)
    validate(config)
    check_devices(config)
    setup_logging(None)
    with contextlib.ExitStack() as stack:
        # The lock first (a second process on the same workdir stops before loading data), then
        # everything that can fail on a user's input (config, data, model), before anything is
        # written: a failed start removes a workdir it created (``claim_workdir``).
        claim = None
        if is_main_process():
            check_writable(workdir)
            claim = stack.enter_context(claim_workdir(workdir))
        replaced = check_workdir_config(
            config, workdir, replace_unreadable=replace_unreadable_config
        )
        run = Run(config, validated=True)
        if replaced and has_checkpoints(workdir):  # an unreadable config.json to be replaced
            _check_checkpoints_fit(workdir, run)
        _check_not_past_the_end(run, workdir)
        check_profile_steps(
            config.profile_steps, run.total_steps, max(saved_steps(workdir), default=0)
        )
        run.check_parameter_names()  # optim.no_decay's names, the frozen modules: exist
        if not has_checkpoints(workdir):  # keys it does not use; a resumed run goes on as it was
            check_unused_keys(config)
        run.check_photos()  # a truncated photo or an unwritable decode cache: named now
        if claim is not None:
            claim.keep()
        prepare_workdir(config, workdir, replace_unreadable=replace_unreadable_config)
        setup_logging(workdir)
        return _train(config, workdir, run, stack)


def _check_checkpoints_fit(workdir: str, run: Run) -> None:
    """Before ``--replace_unreadable_config`` writes ``config.json``: the state stored in the
    run's newest checkpoint has the structure of this config's model (read from the
    checkpoint's metadata), else ``ConfigError`` (nothing written)."""
    ckpts = Checkpoints(workdir, create=False)
    try:
        difference = ckpts.mismatch("latest", run.initial_state)
    finally:
        ckpts.close()
    if difference:
        raise ConfigError(
            f"--replace_unreadable_config: this config does not fit the run's checkpoints "
            f"({difference}); config.json is left as it was. Give the config the run was "
            "trained with (the same method config and --config.* flags)"
        )


def _check_not_past_the_end(run: Run, workdir: str) -> None:
    """Refuses a ``train.epochs`` that ends before the step the workdir's run has reached."""
    steps = max(saved_steps(workdir), default=0)
    if steps > run.total_steps:
        epochs = steps / run.steps_per_epoch
        raise ConfigError(
            f"the run in {workdir} has trained {steps} steps ({epochs:g} epochs), more than "
            f"train.epochs={run.config.train.epochs} allows; set --config.train.epochs to at "
            f"least {math.ceil(epochs)} to continue it, or use another --workdir"
        )


def _train(
    config: ml_collections.ConfigDict, workdir: str, run: Run, stack: contextlib.ExitStack
) -> dict[str, Any]:
    """The body of :func:`train_and_evaluate` once the workdir is prepared and locked (what it
    opens is closed by ``stack``, also on failure)."""
    ckpts = Checkpoints(workdir)
    stack.callback(ckpts.close)  # also when a save or a step fails
    state, resumed = run.initial_state, ckpts.latest.latest_step() is not None
    meta: dict[str, Any] = {}
    if resumed:
        state, meta = ckpts.restore("latest", state)
        log.info("Resuming from the checkpoint at step %d in %s", int(state.step), workdir)
    start = int(state.step)
    # Records after the checkpoint resumed from (all of them without one, the untrained
    # evaluation included) are recomputed, so they are dropped first.
    writer = MetricWriter(
        os.path.join(workdir, "metrics.jsonl"),
        resume_step=start if resumed else -1,
        enabled=is_main_process(),
        tensorboard=config.train.tensorboard,
    )
    stack.callback(writer.close)
    evaluations = Evaluations(config, run, writer, ckpts)
    _log_start(config, run)
    if start == 0:
        if config.eval.at_start:
            _evaluate_finite(evaluations, state, 0, config, workdir)
        state = run.prepare(state)
    train_step = run.make_train_step()
    loop = _Loop(run, train_step, writer, ckpts, evaluations, os.path.join(workdir, "profile"))
    loop.pending = unlogged_from_meta(meta)  # the steps before the checkpoint not yet logged
    try:
        loop(state, start)
    except jax.errors.JaxRuntimeError as e:  # another process of the run may have died
        line = peer_failure(e, saved_steps(workdir))
        if line is None:
            raise
        exit_after_peer_failure(line, EXIT_USAGE)  # at once: before anything waits on it
    summary = evaluations.summary()
    compiles = train_step._cache_size()  # type: ignore[attr-defined]
    # A finished run run again takes no step: it keeps the count of the process that trained.
    summary["train_step_compiles"] = compiles or _previous_compiles(workdir)
    summary["backends"] = run.backends.record()  # the convolutions, kNN and k-means it ran
    selected = evaluations.evaluate_selected(workdir)
    if selected is not None:
        summary["selected"] = selected
    if is_main_process():
        atomic_write(os.path.join(workdir, "results.json"), json.dumps(summary, indent=2))
    ckpts.close()
    return summary


def _log_start(config: ml_collections.ConfigDict, run: Run) -> None:
    """Logs the data, the schedule and, for multi-host input, this process's rows."""
    log.info(
        "Data %s: %s | %d steps/epoch, %d epochs",
        config.data.name,
        ", ".join(f"{k} {len(v)} images / {v.num_classes} classes" for k, v in run.splits.items()),
        run.steps_per_epoch,
        config.train.epochs,
    )
    rows = run.program.placement.rows
    if rows:
        log.info(
            "Multi-host input: each of %d processes builds its own rows of every %d-row batch "
            "(this one rows %d-%d)",
            jax.process_count(),
            config.train.batch_size,
            *rows,
        )


def _previous_compiles(workdir: str) -> int:
    """``train_step_compiles`` of the workdir's ``results.json``; 0 if absent or unreadable."""
    try:
        with open(os.path.join(workdir, "results.json")) as f:
            value = json.load(f).get("train_step_compiles", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0


def _epoch_batches(run: Run, state: TrainState, epoch: int, first_step: int, first: bool):
    """The batch iterator of one epoch (from ``first_step`` on) and the possibly updated state;
    the ``first`` epoch of this process logs the pipeline's sizes."""
    spe = run.steps_per_epoch
    sampler, sampler_state = epoch_sampler(run.sampler, state.sampler_state, epoch, spe)
    make_batch, sizes = input_pipeline(run.batch_maker(sampler), run.config.data)
    if first:
        log.info("Input pipeline: %s", sizes.describe())
    batches = train_batches(
        make_batch,
        start_step=first_step,
        total_steps=(epoch + 1) * spe,
        num_threads=sizes.threads,
        prefetch=run.config.data.prefetch,
        num_workers=sizes.workers,
    )
    return batches, state.replace(sampler_state=sampler_state)


class _Loop:
    """Runs the remaining steps: logging, evaluation and checkpoints at their intervals."""

    def __init__(
        self,
        run: Run,
        train_step: StepFn,
        writer: MetricWriter,
        ckpts: Checkpoints,
        evaluate: Callable[[TrainState, int], None],
        profile_dir: str,
    ) -> None:
        self.run, self.train_step, self.writer = run, train_step, writer
        self.ckpts, self.evaluate = ckpts, evaluate
        self.pending: list[dict[str, jax.Array]] = []
        cfg = run.config
        self.lr = learning_rate(cfg.optim, run.steps_per_epoch, run.total_steps)
        self.profile = profile_range(cfg.profile_steps) if is_main_process() else None
        self.profile_dir = profile_dir
        self.tracing = False

    def __call__(self, state: TrainState, start: int) -> TrainState:
        spe, tc = self.run.steps_per_epoch, self.run.config.train
        if self.profile is not None:  # a range begun before the resume step: from there
            self.profile = (max(self.profile[0], start), self.profile[1])
        self.bar = tqdm(
            total=self.run.total_steps,
            initial=start,
            unit="step",
            disable=not tc.progress_bar,
            dynamic_ncols=True,
            mininterval=0.5 if sys.stderr.isatty() else 30.0,  # a log file: a line every 30 s
        )
        self.tick, self.tick_step = time.perf_counter(), start
        step = start
        for epoch in range(start // spe, tc.epochs):
            first_step = max(start, epoch * spe)
            batches, state = _epoch_batches(self.run, state, epoch, first_step, first_step == start)
            for batch in batches:
                self._profile(state, step)
                state, metrics = self.train_step(state, batch)
                step += 1
                self._after_step(state, metrics, step)
                raise_if_stopped()  # a stop whose exception a finaliser swallowed
        self._profile(state, step, stop=True)
        self.bar.close()
        return state

    def _profile(self, state: TrainState, step: int, stop: bool = False) -> None:
        """Starts the profiler trace before step ``a`` of ``profile_steps`` and stops it before
        step ``b`` (or at the end), once the traced steps have finished."""
        if self.profile is None:
            return
        first, end = self.profile
        if step == first and not stop:
            jax.profiler.start_trace(self.profile_dir)
            self.tracing = True
        elif self.tracing and (step == end or stop):
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.tracing = False
            log.info("Profiler trace of steps %d-%d in %s", first, step - 1, self.profile_dir)

    def _after_step(self, state: TrainState, metrics: dict[str, jax.Array], step: int) -> None:
        tc, ec = self.run.config.train, self.run.config.eval
        spe, total = self.run.steps_per_epoch, self.run.total_steps
        self.pending.append(metrics)
        if len(self.pending) > _MAX_IN_FLIGHT:
            # Bound asynchronous dispatch: the bar then shows finished steps, and host memory for
            # queued batches stays small, while the next steps still overlap with this one.
            jax.block_until_ready(self.pending[-_MAX_IN_FLIGHT - 1])
        self.bar.update(1)
        epoch_end = step % spe == 0
        if step % tc.log_every_steps == 0 or epoch_end or step == total:
            self._log(state, step)
        if epoch_end and (step // spe % ec.every_epochs == 0 or step == total):
            _evaluate_finite(self.evaluate, state, step // spe, self.run.config, self.ckpts.workdir)
        if step % tc.checkpoint_every_steps == 0 or epoch_end or step == total:
            self.ckpts.save(state, {"epoch": step / spe, **unlogged_meta(self.pending)})

    def _log(self, state: TrainState, step: int) -> None:
        pending = jax.device_get(self.pending)
        self.pending = []
        means = {k: float(np.mean([m[k] for m in pending])) for k in pending[0]}
        _check_finite(state, step, self.run.config, self.ckpts.workdir)
        now = time.perf_counter()
        ips = (
            (step - self.tick_step) * self.run.config.train.batch_size / max(now - self.tick, 1e-9)
        )
        self.tick, self.tick_step = now, step
        epoch = step / self.run.steps_per_epoch
        lr = float(self.lr(step - 1))  # of the last update
        record = {"kind": "train", "step": step, "epoch": epoch, **means, "lr": lr, "img_s": ips}
        self.writer.write(record)
        self.bar.set_postfix(loss=f"{means['loss']:.4f}", img_s=f"{ips:.0f}")


def unlogged_meta(pending: list[dict[str, Any]]) -> dict[str, Any]:
    """The metrics of the steps since the last log point, for a checkpoint's JSON metadata
    (each value with its dtype; a float of JSON reads back bit for bit): a run resumed from the
    checkpoint logs the means of the same steps as an uninterrupted run."""
    if not pending:
        return {}
    steps = jax.device_get(pending)
    return {
        "unlogged": [
            {k: [_exact(v), str(np.asarray(v).dtype)] for k, v in m.items()} for m in steps
        ]
    }


def _exact(value: Any) -> float | list:
    """A metric's value as JSON numbers (float64: every float32, bfloat16 or int32 exactly)."""
    return np.asarray(value, np.float64).tolist()


def unlogged_from_meta(meta: dict[str, Any]) -> list[dict[str, np.ndarray]]:
    """The per-step metrics :func:`unlogged_meta` stored (none in a checkpoint written before
    they were stored, or at a log point)."""
    return [
        {k: np.asarray(v, dtype=jax.numpy.dtype(dtype)) for k, (v, dtype) in m.items()}
        for m in meta.get("unlogged", [])
    ]


def _check_finite(
    state: TrainState, step: int, config: ml_collections.ConfigDict, workdir: str
) -> None:
    """Stops a run whose steps were skipped as non-finite, naming a command that runs: the
    same config in a new workdir with a tenth of the learning rate (the seed and the learning
    rate change the experiment, so this workdir refuses them)."""
    bad = int(state.nonfinite)
    if not bad:
        return
    raise NonFiniteLossError(
        f"the loss or its gradient was NaN/inf in {bad} step(s) up to step {step}; those "
        f"updates were skipped and no checkpoint was written after them. {_retry(config, workdir)}"
    )


def _evaluate_finite(
    evaluate: Callable[[TrainState, int], None],
    state: TrainState,
    epoch: int,
    config: ml_collections.ConfigDict,
    workdir: str,
) -> None:
    """``evaluate(state, epoch)``; embeddings that are not finite stop the run by the rule of a
    non-finite loss (:func:`_check_finite`): one line, no checkpoint of this step, and a command
    that trains again (the untrained model's: its weights or the data are to blame)."""
    try:
        evaluate(state, epoch)
    except NonFiniteEmbeddingError as e:
        step = int(state.step)
        if step == 0:
            raise NonFiniteLossError(
                f"at the evaluation of the untrained model, {e.found}: check the weights "
                "file of model.pretrained and the data for corrupt images"
            ) from None
        raise NonFiniteLossError(
            f"at the evaluation of step {step}, {e.found}; no checkpoint was written for this "
            f"step. {_retry(config, workdir)}"
        ) from None


def _retry(config: ml_collections.ConfigDict, workdir: str) -> str:
    """What to do after non-finite training: check the data, or the command that trains the
    same config in a new workdir with a tenth of the learning rate (the seed and the learning
    rate change the experiment, so this workdir refuses them)."""
    lr = lowered_rate(config.optim)
    fresh = f"{workdir.rstrip(os.sep)}-lr{lr:g}"
    count = 2
    while os.path.exists(fresh):
        fresh, count = f"{workdir.rstrip(os.sep)}-lr{lr:g}-{count}", count + 1
    stored = os.path.join(workdir, "config.json")
    return (
        "Check the data for corrupt images, or train again with a lower learning rate in a new "
        f"workdir (this one keeps its config): python train.py --config {shlex.quote(stored)} "
        f"--workdir {shlex.quote(fresh)} --config.optim.lr={lr:g}"
    )
