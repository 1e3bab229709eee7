"""The search over each row's hyperparameters: an Optuna study per row, stored in ``DIR``.

The storage is Optuna's journal file ``DIR/optuna.journal`` by default (an append-only log:
a driver killed at any moment leaves it readable, and it needs no server), or any database
URL Optuna takes (``--storage sqlite:///...``, ``postgresql://...``). Each row is one Optuna
study (named by the row), maximising the candidate's validation score (its best
``metric`` over the epochs, the mean over the folds with :class:`jdml.study.spec.Folds`).

The row's own values are the first candidate (``enqueue_trial``; a grid holds them among its
choices), so that the preset is always among those compared. The samplers
(:data:`jdml.study.spec.SAMPLERS`): ``tpe`` (the default: Optuna's TPE, whose first
``n_startup_trials`` = 10 candidates are random, so at budgets up to 10 it *is* random
search), ``random`` and ``grid`` (the combinations of the :class:`~jdml.study.spec.Choice`
spaces, in a seeded random order). ``bench/bench_study_sampler.py`` measured the choice
(``bench/results/cpu/study-sampler.txt``): the regret of the selected candidate is the same
for TPE and random search up to 8 candidates, and lower for TPE at 16 and 32 (two knobs: 0.30
against 0.40 and 0.23 against 0.33 validation points); a grid wins only at 4 candidates of one
knob, and loses at small budgets of two.

A candidate whose driver was killed stays ``RUNNING`` in the storage with its values: the next
driver runs it again with the same values (its runs resume from their checkpoints) and tells
Optuna its score then.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from jdml.study.spec import Choice, Float, Int

JOURNAL = "optuna.journal"


def _optuna():
    try:
        import optuna
    except ImportError:
        from jdml.errors import StudyError

        raise StudyError(
            "jdml study needs Optuna: pip install 'jdml[study]' (or pip install optuna)"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def storage(directory: str, url: str | None = None):
    """The Optuna storage: ``url`` if given, else the journal file in ``directory``."""
    optuna = _optuna()
    if url:
        return url
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    path = os.path.join(directory, JOURNAL)
    backend = JournalFileBackend(path, lock_obj=JournalFileOpenLock(path, grace_period=30))
    return optuna.storages.JournalStorage(backend)


def row_seed(seed: int, row: str) -> int:
    """The sampler's seed of a row: ``seed`` mixed with the row's name (stable across runs)."""
    digest = hashlib.sha256(f"{seed}:{row}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _encode(value: Any) -> str:
    return json.dumps(value, default=list)


def _decode(text: str, dim: Choice) -> Any:
    for value in dim.values:
        if _encode(value) == text:
            return value
    raise ValueError(f"{text} is not one of {dim.values}")


def sampler(kind: str, seed: int, space: Mapping[str, Float | Int | Choice]):
    optuna = _optuna()
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if kind == "grid":
        grid = {}
        for key, dim in space.items():
            if not isinstance(dim, Choice):
                raise ValueError(
                    f"sampler='grid' needs Choice spaces only; {key!r} is a {type(dim).__name__}"
                )
            grid[key] = [_encode(v) for v in dim.values]
        return optuna.samplers.GridSampler(grid, seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def open_row(store: Any, row: str, kind: str, seed: int, space: Mapping[str, Float | Int | Choice]):
    """The row's Optuna study (created on first use)."""
    optuna = _optuna()
    return optuna.create_study(
        study_name=row,
        storage=store,
        sampler=sampler(kind, row_seed(seed, row), space),
        direction="maximize",
        load_if_exists=True,
    )


def encode_values(space: Mapping[str, Float | Int | Choice], values: Mapping[str, Any]):
    """A candidate's values as Optuna parameters (choices by their JSON text)."""
    return {k: _encode(v) if isinstance(space[k], Choice) else v for k, v in values.items()}


def suggest(trial: Any, space: Mapping[str, Float | Int | Choice]) -> dict[str, Any]:
    """The candidate's values, sampled (or the enqueued ones) through ``trial``."""
    out = {}
    for key, dim in space.items():
        if isinstance(dim, Choice):
            text = trial.suggest_categorical(key, [_encode(v) for v in dim.values])
            out[key] = _decode(text, dim)
        elif isinstance(dim, Int):
            out[key] = trial.suggest_int(key, dim.low, dim.high, log=dim.log)
        else:
            out[key] = trial.suggest_float(key, dim.low, dim.high, log=dim.log)
    return out


def decode_params(space: Mapping[str, Float | Int | Choice], params: Mapping[str, Any]):
    """The values of a stored trial's parameters."""
    return {
        k: _decode(params[k], dim) if isinstance(dim, Choice) else params[k]
        for k, dim in space.items()
    }


def tell(study: Any, trial: Any, value: float | None = None, failed: bool = False) -> None:
    """Tells ``study`` a candidate's score (or that it failed). Optuna's grid sampler asks the
    study to stop once its grid is spent, which only an ``optimize`` loop can; the score is
    stored before that request, which is dropped here."""
    states = state_names()
    try:
        if failed:
            study.tell(trial, state=states.FAIL, skip_if_finished=True)
        else:
            study.tell(trial, value, skip_if_finished=True)
    except RuntimeError as e:
        if "Study.stop" not in str(e):
            raise


def grid_size(space: Mapping[str, Float | Int | Choice]) -> int:
    """The combinations of a space of choices (0 if any dimension is not a Choice)."""
    size = 1
    for dim in space.values():
        if not isinstance(dim, Choice):
            return 0
        size *= len(dim.values)
    return size


def state_names() -> Any:
    return _optuna().trial.TrialState
