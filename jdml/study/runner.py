"""``jdml study run STUDY --dir DIR``: tune on validation, train the seeds, test once.

The phases:

1. **tune**: each row's search (:mod:`jdml.study.search`) tries ``budget`` candidates, each
   trained at the study's tuning seed and scored on validation only (the best epoch's
   metric; the mean over the folds with ``Folds(k)``); the best candidate of each row (ties:
   the earliest, the row's own values first) is selected and written to the ledger. With
   ``budget=1`` the row's own values are selected without a tuning run.
2. **register**: just before the first run that evaluates the test classes starts, the
   pre-registration (claims, family, effects, looks, stopping rule) is frozen in the ledger.
3. **looks**: every row trains the first look's seeds with its selected values; each run's
   checkpoint is selected on validation and only that checkpoint is evaluated on the test
   classes, once, with its per-query hits kept. At the end of each look the stopping rule
   (:func:`jdml.study.claims.decide`) says which claims go on; their rows train the next
   look's seeds.

A rerun resumes: a run with a record is skipped, a killed run resumes from its checkpoint, a
candidate killed while running is run again with its values, and the looks' decisions are
read back from the ledger. One driver runs a folder at a time (a lock in ``DIR``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from jdml.errors import ConfigError, StudyError, WorkdirInUseError
from jdml.fileio import atomic_write
from jdml.study import claims as cl
from jdml.study import ledger, search
from jdml.study import records as rec
from jdml.study.executor import Done, Executor, Task, drive
from jdml.study.spec import (
    Folds,
    Row,
    Study,
    build_config,
    describe,
    digest,
    first_candidate,
    registration,
)

Echo = Callable[[str], None]


@dataclasses.dataclass
class _Context:
    study: Study
    directory: str
    executor: Executor
    echo: Echo
    commit: str
    storage: str | None = None
    xla_cache: bool = True
    failed: list[str] = dataclasses.field(default_factory=list)
    fixed: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


# -- configs and tasks ---------------------------------------------------------------------------


def config_digest(config: Any) -> str:
    """The digest of a run's config up to its seed, where its data are kept (the records hold
    the data's checksum) and what does not change results: the records of one row at
    different seeds share it. A key renamed since studies kept digests is hashed under its old
    name (``jdml.keys.DIGEST_NAMES``), so the rename leaves every record its study's."""
    from jdml.config import RESUMABLE_CHANGES, flatten_config
    from jdml.keys import DIGEST_NAMES

    flat = flatten_config(config.to_dict())
    skip = {"seed", "data.path", "data.cache_dir", *RESUMABLE_CHANGES}
    return digest({DIGEST_NAMES.get(k, k): v for k, v in flat.items() if k not in skip})


def tune_config(study: Study, row: Row, values: dict[str, Any], fold: int | None):
    """A tuning run's config: the candidate's values, the study's tuning keys, its tuning
    seed, validation only (the test classes are never evaluated)."""
    from jdml.keys import set_keys

    c = build_config(study, row, values)
    with c.unlocked():
        set_keys(c, dict(study.tune))
        c.seed = study.tune_seed
        c.train.progress_bar = False
        c.eval.splits = ()
        c.eval.selected_splits = ()
        c.eval.per_query = ()
        if fold is not None:
            c.data.val_folds = study.selection.folds()
            c.data.val_fold = fold
    return c


def seed_config(study: Study, row: Row, values: dict[str, Any], seed: int):
    """A seed run's config: the selected values, validation selects the checkpoint and only
    that checkpoint is evaluated on the test classes, its per-query hits kept."""
    c = build_config(study, row, values)
    with c.unlocked():
        c.seed = seed
        c.train.progress_bar = False
        c.eval.splits = ()
        # The train split too where the row asks for train metrics (Revisiting's spectral decay).
        c.eval.selected_splits = ("test", "train") if c.eval.train_metrics else ("test",)
        c.eval.per_query = (study.metric,)
    return c


def _check_validation(row: Row, config: Any) -> None:
    if config.data.val_fraction <= 0 and not config.data.val_folds:
        raise ConfigError(
            f"row {row.name!r} holds no validation classes out (data.val_fraction=0), so its "
            "checkpoints and candidates would be chosen on the test classes; set data.val_fraction "
            "> 0 in the study's data (e.g. 0.15) or use selection=Folds(k)"
        )


def _check_data(row: Row, config: Any) -> None:
    path = str(config.data.path or "")
    if path and not os.path.exists(path):
        raise ConfigError(
            f"row {row.name!r}: data.path {path} does not exist; give the study's data the "
            "path of your image folder or .npz"
        )


def _task(
    ctx: _Context, name: str, kind: str, row: str, config: Any, workdir: str, record: str, **extra
) -> Task:
    """Writes the task file of one run and returns its task."""
    from jdml.config.saved import to_json

    payload = {
        "name": name,
        "kind": kind,
        "row": row,
        "seed": int(config.seed),
        "epochs": int(config.train.epochs),
        "config": to_json(config),
        "config_sha256": config_digest(config),
        "workdir": os.path.abspath(workdir),
        "record": os.path.abspath(record),
        "metric": ctx.study.metric,
        "metrics": list(ctx.study.metrics),
        "commit": ctx.commit,
        "trial": None,
        "fold": None,
        "settings": {},
        "xla_cache": os.path.abspath(os.path.join(ctx.directory, "xla_cache"))
        if ctx.xla_cache
        else None,
        **extra,
    }
    slug = name.replace(" ", "-")
    task_file = os.path.join(ctx.directory, "tasks", slug + ".json")
    atomic_write(task_file, json.dumps(payload, indent=1) + "\n")
    return Task(
        name, os.path.abspath(task_file), os.path.join(ctx.directory, "logs", slug + ".log")
    )


def _drive(ctx: _Context, next_task: Callable[[], Task | None], on_done: Callable[[Done], None]):
    """:func:`jdml.study.executor.drive` on the study's executor, its failures counted."""
    ctx.failed += drive(ctx.executor, next_task, on_done, ctx.echo)


# -- phase 1: tuning ------------------------------------------------------------------------------


def searched(event: dict[str, Any], study: Study) -> bool:
    """Whether a row's ``selected`` event comes from a search with the study's budget."""
    return study.budget == 1 or int(event.get("tried") or 0) >= study.budget


def selections(directory: str) -> dict[str, dict[str, Any]]:
    """The rows' selected candidates, from the ledger (row -> its ``selected`` event)."""
    return {e["row"]: e for e in ledger.events(directory) if e.get("event") == "selected"}


def candidate_score(directory: str, row: str, trial: int, folds: int) -> float | None:
    """A candidate's validation score: its best-epoch metric, the mean over the folds; None
    until every fold has its record."""
    values = []
    for fold in range(folds) if folds > 1 else (None,):
        record = rec.read(rec.tune_record_path(directory, row, trial, fold))
        if record is None:
            return None
        values.append(next(v for k, v in record["best"].items() if k != "epoch"))
    return float(sum(values) / len(values))


def _tune(ctx: _Context) -> dict[str, dict[str, Any]]:
    """Phase 1; returns every row's selected candidate (row -> its values)."""
    study, directory = ctx.study, ctx.directory
    chosen = selections(directory)
    # A row not searched with the study's budget (its values its own or another row's, as
    # records made before the study tool have them) is searched now; its selection then
    # supersedes the earlier one (:func:`_supersede`).
    todo = [r for r in study.rows if r.name not in chosen or not searched(chosen[r.name], study)]
    if study.budget == 1:
        for row in todo:
            event = {"event": "selected", "row": row.name, "values": first_candidate(study, row)}
            chosen[row.name] = ledger.append(directory, {**event, "trial": None, "score": None})
    if not todo or study.budget == 1:
        return {k: v["values"] for k, v in chosen.items()}
    store = search.storage(directory, ctx.storage)
    states = search.state_names()
    folds = study.selection.folds() if isinstance(study.selection, Folds) else 1
    optuna_studies, queue, waiting = {}, [], {}  # waiting: (row, trial) -> folds left
    for row in todo:
        s = search.open_row(store, row.name, study.sampler, study.search_seed, row.space)
        optuna_studies[row.name] = s
        if not s.trials and study.sampler != "grid":  # the row's own values first
            s.enqueue_trial(search.encode_values(row.space, first_candidate(study, row)))
        for t in s.trials:  # candidates a killed driver left running: again, same values
            if t.state == states.RUNNING:
                values = search.decode_params(row.space, t.params)
                tasks = _candidate_tasks(ctx, row, t.number, values, folds, waiting)
                if tasks is None:  # every fold recorded before the kill: scored now
                    score = candidate_score(directory, row.name, t.number, folds)
                    diverged = not math.isfinite(score)
                    search.tell(s, t.number, None if diverged else score, failed=diverged)
                queue += tasks or []

    def used(row: Row) -> int:
        live = (states.COMPLETE, states.RUNNING, states.FAIL)
        return sum(t.state in live for t in optuna_studies[row.name].trials)

    def ask(row: Row) -> tuple[Any, dict[str, Any]]:
        """A new candidate; one whose values a candidate of the row already has (a small
        space of choices) is dropped (``PRUNED``, not counted) while others remain."""
        s = optuna_studies[row.name]
        tried = [t.params for t in s.trials if t.state != states.PRUNED and t.params]
        for _ in range(100):
            trial = s.ask()
            values = search.suggest(trial, row.space)
            if trial.params not in tried:
                break
            s.tell(trial.number, state=states.PRUNED)
        return trial, values

    def next_task() -> Task | None:
        while not queue:
            open_rows = [r for r in todo if used(r) < study.budget]
            if not open_rows:
                return None
            row = min(open_rows, key=used)  # the rows' searches advance side by side
            trial, values = ask(row)
            queue.extend(_candidate_tasks(ctx, row, trial.number, values, folds, waiting) or [])
        return queue.pop(0)

    def on_done(done: Done) -> None:
        with open(done.task.task_file) as f:
            task = json.load(f)
        key = (task["row"], task["trial"])
        s = optuna_studies[task["row"]]
        if done.code or not os.path.exists(task["record"]):
            # A crash, not a result: the candidate stays RUNNING, and the next run of the study
            # runs it again with its values (resuming its runs) instead of spending the budget.
            waiting.pop(key, None)
            return
        if key not in waiting:
            return
        waiting[key] -= 1
        if waiting[key] == 0:
            del waiting[key]
            score = candidate_score(directory, task["row"], task["trial"], folds)
            diverged = score is None or not math.isfinite(score)
            search.tell(s, task["trial"], None if diverged else score, failed=diverged)

    _drive(ctx, next_task, on_done)
    for row in todo:
        trials = [t for t in optuna_studies[row.name].trials if t.state == states.COMPLETE]
        if used(row) < study.budget or any(
            t.state == states.RUNNING for t in optuna_studies[row.name].trials
        ):
            continue  # runs failed: the next run tries again
        if not trials:
            raise StudyError(
                f"every candidate of row {row.name!r} diverged (a loss or embedding not "
                f"finite); see its logs in {os.path.join(directory, 'logs')} and narrow its "
                "space (e.g. lower learning rates)"
            )
        best = max(trials, key=lambda t: (t.value, -t.number))
        event = {
            "event": "selected",
            "row": row.name,
            "trial": best.number,
            "values": search.decode_params(row.space, best.params),
            "score": best.value,
            "tried": used(row),
            "failed": sum(t.state == states.FAIL for t in optuna_studies[row.name].trials),
            # FAIL: diverged (counted in the budget); a crashed candidate stays RUNNING
        }
        chosen[row.name] = ledger.append(directory, event)
        ctx.echo(f"{row.name}: selected candidate {best.number} {event['values']} "
                 f"(validation {study.metric} {100 * best.value:.2f})")  # fmt: skip
    return {k: v["values"] for k, v in chosen.items()}


def _candidate_tasks(
    ctx: _Context, row: Row, trial: int, values: dict[str, Any], folds: int, waiting: dict
) -> list[Task] | None:
    """The runs of one candidate (one per fold) that have no record, counted in
    ``waiting``; None when every one is recorded (a driver killed before it scored them)."""
    tasks = []
    for fold in range(folds) if folds > 1 else (None,):
        record = rec.tune_record_path(ctx.directory, row.name, trial, fold)
        if os.path.exists(record):
            continue
        c = tune_config(ctx.study, row, values, fold)
        where = rec.tune_run_dir(ctx.directory, row.name, trial, fold)
        name = f"tune {row.name} {rec.tune_name(trial, fold)}"
        settings = json.loads(json.dumps(values, default=list))
        extra = {"trial": trial, "fold": fold, "settings": settings}
        tasks.append(_task(ctx, name, "tune", row.name, c, where, record, **extra))
    if not tasks:
        return None
    waiting[(row.name, trial)] = len(tasks)
    return tasks


# -- phase 3: the looks ---------------------------------------------------------------------------


def _seed_tasks(ctx: _Context, rows: list[Row], seeds: range, selected: dict) -> Iterator[Task]:
    for row in rows:
        for seed in seeds:
            record = rec.seed_record_path(ctx.directory, row.name, seed)
            if os.path.exists(record):
                continue
            values = selected[row.name]
            c = seed_config(ctx.study, row, values, seed)
            where = rec.seed_run_dir(ctx.directory, row.name, seed)
            settings = json.loads(json.dumps(values, default=list))
            yield _task(ctx, f"{row.name} seed {seed}", "seed", row.name, c, where, record,
                        settings=settings)  # fmt: skip


def current_decision(directory: str, look: int) -> dict[str, Any] | None:
    """The ledger's decision at the end of ``look`` if it still holds: made by this stopping
    rule (not a record's earlier rule, ``rule``), after every record that was superseded, and
    after the decisions of the looks before it; None: decide it (again)."""
    events = ledger.events(directory)
    at = {i: e for i, e in enumerate(events) if e.get("event") == "look" and e["look"] == look}
    if not at:
        return None
    index, event = max(at.items())
    if event.get("rule") is not None:
        return None
    superseded = [i for i, e in enumerate(events) if e.get("event") == "superseded"]
    earlier = [i for i, e in enumerate(events) if e.get("event") == "look" and e["look"] < look]
    if any(i > index for i in superseded + earlier):
        return None
    return event


def stops_of(decisions: dict[int, dict[str, Any]]) -> dict[str, int]:
    """claim text -> the first look whose decision (look -> its ``look`` event) stopped it."""
    out: dict[str, int] = {}
    for look, event in sorted(decisions.items()):
        for text in event.get("stop", []):
            out.setdefault(text, look)
    return out


def stop_looks(directory: str) -> dict[str, int]:
    """claim text -> the look it stopped at, from the ledger."""
    return stops_of(ledger.look_decisions(directory))


def _log_test(directory: str, done: Done) -> None:
    """A ``tested`` event in the ledger for a seed run that recorded its test result: its row,
    seed and the record's sha256, so that the ledger orders every test result against the
    registration's changes."""
    with open(done.task.task_file) as f:
        task = json.load(f)
    if not done.code and os.path.exists(task["record"]):
        _append_tested(directory, task["row"], task["seed"], task["record"])


def _append_tested(directory: str, row: str, seed: int, path: str, **extra: str) -> None:
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    ledger.append(directory, {"event": "tested", "row": row, "seed": seed,
                              "record_sha256": digest, **extra})  # fmt: skip


def _log_untold_tests(directory: str) -> None:
    """``tested`` events for the seed records this tool made (they carry a config digest) that
    the ledger does not name: a driver killed between a run's end and its event leaves one.
    Their time is when they are found, after the record was made (``logged_late``)."""
    told = {(e["row"], e["seed"]) for e in ledger.events(directory) if e.get("event") == "tested"}
    for row, by_seed in rec.seed_records(directory).items():
        for seed, record in sorted(by_seed.items()):
            if "config_sha256" in record and (row, seed) not in told:
                _append_tested(directory, row, seed, rec.seed_record_path(directory, row, seed),
                               logged_late="found when the study was next run")  # fmt: skip


def _look(ctx: _Context, look: int, rows: list[Row], selected: dict) -> list[str]:
    """Trains look ``look``'s seeds of ``rows``; returns the claims that go on (the ledger's
    decision, made now if this look has none yet)."""
    study = ctx.study
    seeds = range(study.looks[look - 1])
    _log_untold_tests(ctx.directory)
    tasks = _seed_tasks(ctx, rows, seeds, selected)
    first = next(tasks, None)
    if first is not None or rec.seed_records(ctx.directory):
        ledger.freeze(ctx.directory, registration(study))
    pending = iter([first] if first else [])
    chained = (t for part in (pending, tasks) for t in part)
    _drive(ctx, lambda: next(chained, None), lambda done: _log_test(ctx.directory, done))
    decided = current_decision(ctx.directory, look)
    if decided is not None:
        return list(decided.get("go_on", []))
    from jdml.config import flatten_config

    configs = {r.name: flatten_config(build_config(study, r).to_dict()) for r in study.rows}
    by_row = rec.seed_records(ctx.directory)
    stopped = {t: k for t, k in stop_looks(ctx.directory).items() if k < look}
    reg = registration(study)
    readings = cl.claim_readings(reg, configs, by_row, stopped, at=look, fixed=ctx.fixed)
    going = [c.text for c in study.claims if c.text not in stopped]
    missing = [t for t in going if t not in readings or readings[t].look != look]
    if missing:
        raise StudyError(
            f"look {look} is incomplete: claim(s) {missing} lack seed records (runs failed); run "
            "the study again to retry them"
        )
    family = {c.text for c in study.claims if c.family}
    level = cl.look_level(study.looks, study.alpha)
    groups = cl.family_groups(reg)
    stop, go_on = cl.decide(readings, family, stopped, look, study.looks, level, groups)
    ledger.append(ctx.directory, {"event": "look", "look": look, "stop": stop, "go_on": go_on})
    ctx.echo(f"look {look}: {len(stop)} claim(s) stop, {len(go_on)} go on")
    return go_on


# -- the whole run -------------------------------------------------------------------------------


def _supersede(ctx: _Context, selected: dict[str, dict[str, Any]]) -> None:
    """Moves aside the seed records (and run folders) a row trained with values of an earlier
    selection that a later one replaced (a search after values shared from another row), to
    ``DIR/superseded/``, so that the row's seeds train again with its selection; a
    ``superseded`` event in the ledger says which, and their looks are decided anew. Nothing is
    deleted."""
    events = [e for e in ledger.events(ctx.directory) if e.get("event") == "selected"]
    rows = {r.name: r for r in ctx.study.rows}
    for row_name, by_seed in rec.seed_records(ctx.directory).items():
        if row_name not in selected or row_name not in rows:
            continue
        row = rows[row_name]
        now = json.loads(json.dumps(selected[row_name]))
        earlier = [e["values"] for e in events if e["row"] == row_name][:-1]
        trained = {s: rec.trained_values(r, row.space) for s, r in by_seed.items()}
        stale = rec.stale_seeds(trained, row.space, now, earlier)
        if not stale:
            continue
        for seed in stale:
            for path in (rec.seed_record_path(ctx.directory, row_name, seed),
                         rec.seed_run_dir(ctx.directory, row_name, seed)):  # fmt: skip
                if os.path.exists(path):
                    target = os.path.join(ctx.directory, rec.SUPERSEDED,
                                          os.path.relpath(path, ctx.directory))  # fmt: skip
                    if os.path.exists(target):
                        raise StudyError(
                            f"{target} exists; move it away (nothing is replaced) and run again"
                        )
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    os.rename(path, target)
        old = trained[stale[0]]
        ledger.append(ctx.directory, {"event": "superseded", "row": row_name, "seeds": stale,
                                      "values": old, "by": now})  # fmt: skip
        ctx.echo(f"{row_name}: seeds {stale} trained with {old} moved to superseded/; they train "
                 f"again with {now}")  # fmt: skip


def _check_records(ctx: _Context, selected: dict[str, dict[str, Any]]) -> None:
    """Refuses seed records trained with another config of their row than the study's now
    (with the row's selected values)."""
    for row, by_seed in rec.seed_records(ctx.directory).items():
        if row not in selected:
            continue
        config = seed_config(ctx.study, ctx.study.row(row), selected[row], 0)
        digest_now = config_digest(config)
        for seed, record in by_seed.items():
            if record.get("config_sha256") not in (None, digest_now):
                path = rec.seed_record_path(ctx.directory, row, seed)
                raise StudyError(
                    f"row {row!r}'s config has changed since {path} was trained; give the "
                    "changed row another name, or run the study in another --dir (records are "
                    "never replaced)"
                )


def _fixed_baselines(ctx: _Context, selected: dict[str, dict[str, Any]]) -> dict[str, dict]:
    """The fixed baselines the claims name, evaluated once (here, in the driver) on the data
    of the first such claim's row and recorded in the study's folder."""
    from jdml.study import baselines

    claims = [c for c in ctx.study.claims if c.fixed]
    if not claims:
        return {}
    names = sorted({c.fixed for c in claims})
    row = ctx.study.row(claims[0].row)
    config = seed_config(ctx.study, row, selected[row.name], 0)
    try:
        found = baselines.ensure(ctx.directory, config, names, ctx.study.metrics, ctx.commit)
    except ValueError as e:
        raise StudyError(str(e)) from None
    return dict(found)


def _checked_configs(study: Study, directory: str) -> dict[str, dict[str, Any]]:
    """Every row's flattened config, each checked before the folder is touched.

    Raises:
      StudyError: ``directory`` is a file.
      ConfigError: a row's config is invalid, holds no validation classes out, or names data
        that do not exist.
    """
    from jdml.config import flatten_config
    from jdml.config.validation import validate

    if os.path.exists(directory) and not os.path.isdir(directory):
        raise StudyError(
            f"--dir {directory} is a file; give a folder for the study (new or its own)"
        )
    configs = {}
    for row in study.rows:
        c = seed_config(study, row, first_candidate(study, row), 0)
        try:
            validate(c)
        except ConfigError as e:
            raise ConfigError(f"row {row.name!r}: {e}") from None
        _check_validation(row, c)
        _check_data(row, c)
        configs[row.name] = flatten_config(c.to_dict())
    return configs


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    """Holds the study folder (created) for this driver alone."""
    from jdml.workdir import run_lock

    os.makedirs(directory, exist_ok=True)
    try:
        lock = run_lock(directory)
        lock.__enter__()
    except WorkdirInUseError as e:
        raise StudyError(
            f"study folder {directory} is in use by another `jdml study run` ({e}); wait for it "
            "or stop it, then run again"
        ) from None
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def _describe_and_amend(
    study: Study, directory: str, configs: dict, command: str | None, echo: Echo
) -> dict[str, Any] | None:
    """Writes ``study.json`` (``command``: the command of the runs; None keeps the one there)
    and records an amendment if the pre-registration in force
    differs from the study's; returns the amendment, or None."""
    from jdml.config import flatten_config

    chosen = selections(directory)
    configs = {  # a row with a selection is described with its selected values
        name: flatten_config(
            seed_config(study, study.row(name), chosen[name]["values"], 0).to_dict()
        )
        if name in chosen
        else config
        for name, config in configs.items()
    }
    payload = describe(study, configs)
    payload["command"] = command
    if command is None:  # a registration alone: the command that ran the runs stays
        try:
            with open(os.path.join(directory, "study.json")) as f:
                payload["command"] = json.load(f).get("command", "")
        except (OSError, ValueError):
            payload["command"] = ""
    atomic_write(os.path.join(directory, "study.json"), json.dumps(payload, indent=1) + "\n")
    seen = sum(len(v) for v in rec.seed_records(directory).values())
    amended = ledger.amend_if_changed(directory, registration(study), seen)
    if amended:
        echo(
            f"amendment: the study's {', '.join(amended['changed'])} changed after "
            f"{seen} test result(s); the report lists it"
        )
    return amended


def register(study: Study, directory: str, *, echo: Echo = print) -> dict:
    """Pre-registers ``study`` in ``directory`` now, training nothing: its registration is
    frozen in the ledger (with the number of test results recorded by then), or, if one is
    frozen already and differs, the change is recorded as an amendment. Declare claims and
    effects this way before the runs whose test results they read.

    Returns:
      The ledger's event in force (``registered`` or ``amendment``).

    Raises:
      StudyError, ConfigError: as :func:`run`.
    """
    configs = _checked_configs(study, directory)
    with _locked(directory):
        amended = _describe_and_amend(study, directory, configs, None, echo)
        if amended is not None:
            return amended
        seen = sum(len(v) for v in rec.seed_records(directory).values())
        event = ledger.frozen(directory)
        if event is None:
            event = ledger.freeze(directory, registration(study), tests_seen=seen)
            echo(f"registered: sha256 {event['sha256'][:12]}, {seen} test result(s) recorded")
        else:
            echo(f"the registration in force is unchanged (sha256 {event['sha256'][:12]})")
        return event


def run(
    study: Study,
    directory: str,
    executor: Executor,
    *,
    echo: Echo = print,
    command: str = "",
    storage: str | None = None,
    xla_cache: bool = True,
) -> dict[str, Any]:
    """Runs (or resumes) every phase of ``study`` in ``directory`` on ``executor``.

    Returns:
      A summary: the selected values per row, the seeds recorded per row, the runs that
      failed.

    Raises:
      StudyError: another driver holds the folder, a row's config changed under its
        records, a look cannot be completed (failed runs: run again), or runs failed.
      ConfigError: a row's config is invalid (nothing is trained).

    Args:
      study: the study (:func:`jdml.study.spec.load`).
      directory: its folder (created; a rerun resumes).
      executor: where the runs execute (:mod:`jdml.study.executor`).
      echo: where the progress lines go.
      command: the command line that ran it, shown by the report.
      storage: Optuna's storage URL (default the journal file in ``directory``).
      xla_cache: share XLA's compiled programs between the runs (``directory/xla_cache``).
    """
    configs = _checked_configs(study, directory)
    with _locked(directory):
        _describe_and_amend(study, directory, configs, command, echo)
        ctx = _Context(study, directory, executor, echo, rec.commit(), storage, xla_cache)
        start = time.perf_counter()
        selected = _tune(ctx)
        if len(selected) < len(study.rows):
            raise StudyError(
                f"{len(ctx.failed)} tuning run(s) failed ({', '.join(ctx.failed)}); see their logs "
                "and run the study again to retry them"
            )
        _supersede(ctx, selected)
        _check_records(ctx, selected)
        ctx.fixed = _fixed_baselines(ctx, selected)
        rows = list(study.rows)
        for look in range(1, len(study.looks) + 1):
            go_on = _look(ctx, look, rows, selected)
            if not go_on:
                break
            wanted = {n for c in study.claims if c.text in go_on for n in (c.row, c.base)}
            rows = [r for r in study.rows if r.name in wanted]
        if ctx.failed:
            raise StudyError(
                f"{len(ctx.failed)} run(s) failed ({', '.join(ctx.failed)}); see their logs and "
                "run the study again to retry them"
            )
        by_row = rec.seed_records(directory)
        took = time.perf_counter() - start
        echo(f"study done in {took:.0f} s; report: jdml study report {directory}")
        return {
            "selected": selected,
            "seeds": {r: sorted(v) for r, v in by_row.items()},
            "failed": ctx.failed,
        }
