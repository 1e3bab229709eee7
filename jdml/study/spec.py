"""A study: a fair comparison of methods, declared in one file before anything is trained.

A study file is config-as-code like the files of ``configs/``: a Python file whose
``get_study()`` returns a :class:`Study`. It declares

* the **rows**: a name and a config (a ``configs/`` spec such as ``"revisiting:loss=triplet"``,
  a ``ConfigDict``, or a function of the sampled hyperparameters), with overrides;
* the **data** every row trains on (``data.*`` keys) and the **selection split**: one
  validation hold-out (:class:`Holdout`, today's ``data.val_fraction``) or ``k``
  class-disjoint folds of the training classes (:class:`Folds`, as *A Metric Learning Reality
  Check* (Musgrave et al., ECCV 2020) does: a candidate scores its mean over the folds);
* per row a **search space** over its own hyperparameters (:class:`Float`, :class:`Int`,
  :class:`Choice`), and **one budget** (candidates per row) for every row, baselines
  included: the Reality Check's point is that a method tuned more than its baselines wins by
  its tuning;
* the **seeds** and their **looks** (Pocock's group-sequential design: seeds added to the
  claims still unresolved, each look read at :func:`jdml.statistics.pocock_level`);
* the **claims**: a pair of rows, the embedding read, the paper's effect with its source, and
  whether the claim belongs to the family Holm's correction runs over.

What a study pre-registers (:func:`registration`: the claims, the family, the effects, the
looks and the stopping rule) is frozen at the first test evaluation (``jdml.study.ledger``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

from jdml.errors import ConfigError

#: How a claim's rows stop: Pocock's looks, a claim stopping once its Holm verdict is settled.
STOPPING_RULE = (
    "Pocock looks; a claim's rows stop at a look only when the claim's verdict under Holm's "
    "correction across the family is settled there (a claim outside the family: its own "
    "verdict); every row trains the first look's seeds"
)


@dataclasses.dataclass(frozen=True)
class Float:
    """A real hyperparameter in ``[low, high]`` (on a log scale with ``log``)."""

    low: float
    high: float
    log: bool = False


@dataclasses.dataclass(frozen=True)
class Int:
    """An integer hyperparameter in ``[low, high]``."""

    low: int
    high: int
    log: bool = False


@dataclasses.dataclass(frozen=True)
class Choice:
    """A hyperparameter taking one of ``values`` (numbers, strings, booleans or tuples)."""

    values: tuple[Any, ...]


Space = Mapping[str, Float | Int | Choice]
Build = Callable[..., ml_collections.ConfigDict]


@dataclasses.dataclass(frozen=True)
class Row:
    """A method as the study trains it.

    Attributes:
      name: the row's key (run folders and records are named by it): letters, digits and
        ``-_+.``.
      config: a ``configs/`` spec (``"revisiting:loss=triplet"``, ``"diva"``), a
        ``ConfigDict``, or a function returning one; a function that takes an argument is
        called with the sampled hyperparameters whose names have no dot (a builder's own
        knobs, e.g. DiVA's auxiliary weight), the dotted ones being set as config keys.
      overrides: dotted config keys set on top of ``config`` (after the study's data and
        common keys).
      space: the row's own hyperparameters to tune: dotted config keys or the builder's
        knobs, each a :class:`Float`, :class:`Int` or :class:`Choice`. The row's own values
        (its config's, or the first of each choice) are the first candidate.
      label: the row's name in tables (default ``name``).
      defaults: the builder's knobs' values of the first candidate (a dotted key's is read
        from the config).
    """

    name: str
    config: str | ml_collections.ConfigDict | Build
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    space: Space = dataclasses.field(default_factory=dict)
    label: str = ""
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def title(self) -> str:
        return self.label or self.name


@dataclasses.dataclass(frozen=True)
class Holdout:
    """Candidates are scored on one validation hold-out of the training classes
    (``data.val_fraction`` of them, chosen by ``data.split_seed``)."""

    def folds(self) -> int:
        return 1


@dataclasses.dataclass(frozen=True)
class Folds:
    """Candidates are scored by their mean over ``k`` class-disjoint folds of the training
    classes (each fold's classes validate once; ``data.val_folds``)."""

    k: int

    def folds(self) -> int:
        return self.k


@dataclasses.dataclass(frozen=True)
class Effect:
    """A gain the paper prints for a claim's comparison: ``value`` in metric points (negative
    where the paper's own row is below its baseline) and ``source``, where it is printed
    (table, dataset, backbone, loss, setting)."""

    value: float
    source: str


@dataclasses.dataclass(frozen=True)
class Claim:
    """``row`` beats ``base`` in the study's metric on the test classes.

    Attributes:
      text: what the claim says.
      row, base: the two rows, compared by their per-seed paired difference.
      concat: read the rows' concatenated heads or cohort members (their
        ``eval.combinations[0]``, or a cohort's ensemble) instead of the main head.
      effect: the paper's effect in metric points (e.g. 0.9 for +0.9 Recall@1), or None.
      source: where the paper prints it.
      effects: every effect the paper prints for this comparison (:class:`Effect`: each
        dataset, backbone, loss, setting), instead of ``effect`` and ``source``; the claim is
        read against the smallest of them.
      paper: the paper and table the claim is from, e.g. ``"DiVA, Tab. 2"``: the report
        groups the claims by the part before the first comma (``"DiVA"``); a paper ending in
        ``"(control)"`` marks a comparison the study adds to the paper's.
      family: whether Holm's correction runs over this claim.
      fixed: instead of a trained ``base`` (give ``base=""``), a baseline without training
        (:data:`jdml.study.baselines.FIXED`: ``"pixels"``, the raw pixels, or ``"features"``,
        the pretrained backbone's pooled features), evaluated once on the test classes; such
        a claim has no seeds of its own on that side (Revisiting, Tab. 1).
    """

    text: str
    row: str
    base: str
    concat: bool = False
    effect: float | None = None
    source: str = ""
    paper: str = ""
    family: bool = True
    fixed: str = ""
    effects: tuple[Effect, ...] = ()

    def printed(self) -> tuple[Effect, ...]:
        """Every effect the claim declares (``effect`` alone: one; none: empty)."""
        if self.effects:
            return tuple(self.effects)
        return () if self.effect is None else (Effect(self.effect, self.source),)


@dataclasses.dataclass(frozen=True)
class Study:
    """A comparison of methods (see the module's docstring).

    Attributes:
      name: the study's title.
      rows: the methods.
      data: the ``data.*`` keys every row trains on.
      claims: the pre-registered claims.
      common: further dotted keys every row gets (the budget of a run: ``train.epochs``, ...).
      selection: :class:`Holdout` or :class:`Folds`.
      budget: the candidates every row's search tries (the same for every row; 1: only the
        row's own values, trained once on validation).
      tune: dotted keys of the tuning runs only (e.g. fewer epochs).
      tune_seed: the seed of every tuning run.
      looks: the seeds each look reads, cumulative: ``(5, 10)`` trains seeds 0-4 for every
        row, and 5-9 for the rows of the claims still unresolved.
      alpha: the design's error: each look reads its interval at ``pocock_level(len(looks),
        alpha)``, and Holm's correction keeps the family's at ``1 -`` that level.
      metric: the test metric the claims read (one of ``eval.metrics``).
      metrics: the metrics every evaluation computes.
      family_by: the family of record of Holm's correction: ``"table"``, every claim of the
        family at once, or ``"paper"``, each paper's claims apart (:func:`jdml.study.claims.
        paper_of`); the report shows the other beside it, and the stopping rule reads the one
        of record.
      sampler: Optuna's sampler: ``"tpe"`` (the default: random search for its first 10
        candidates, then Tree-structured Parzen Estimators), ``"random"`` or ``"grid"`` (the
        combinations of :class:`Choice` spaces, in a seeded order; at least ``budget`` of
        them). Measured on synthetic rows (``bench/bench_study_sampler.py``): TPE equals random
        search up to 10 candidates and beats it from 16; a grid only wins at 4 candidates of
        one knob.
      search_seed: the sampler's seed.
    """

    name: str
    rows: tuple[Row, ...]
    data: Mapping[str, Any]
    claims: tuple[Claim, ...] = ()
    common: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    selection: Holdout | Folds = Holdout()
    budget: int = 4
    tune: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tune_seed: int = 0
    looks: tuple[int, ...] = (5, 10)
    alpha: float = 0.05
    metric: str = "recall@1"
    metrics: tuple[str, ...] = ("recall@1", "map@r", "nmi")
    sampler: str = "tpe"
    search_seed: int = 0
    family_by: str = "table"

    def row(self, name: str) -> Row:
        for row in self.rows:
            if row.name == name:
                return row
        raise ConfigError(f"no row {name!r} in the study; its rows: {self.row_names()}")

    def row_names(self) -> str:
        return ", ".join(r.name for r in self.rows)

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(range(self.looks[-1]))


SAMPLERS = ("random", "tpe", "grid")
FAMILIES = ("table", "paper")
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_+.")


def check(study: Study) -> None:
    """Refuses a study that cannot be run as declared, with one line naming the fix.

    Raises:
      ConfigError: a bad row name, a duplicate row, a claim naming no row, a row without a
        search space while the budget tunes, bad looks, alpha, budget or sampler.
    """
    if not isinstance(study, Study):
        raise ConfigError(
            f"get_study() returned a {type(study).__name__}, not a jdml.study.Study; return "
            "Study(name=..., rows=(...), data={...}) (see experiments/glyph_study.py)"
        )
    if not study.rows:
        raise ConfigError("the study has no rows; give rows=(Row(...), ...)")
    names = [r.name for r in study.rows]
    for name in names:
        if not name or set(name) - _NAME_CHARS or name.startswith("."):
            raise ConfigError(
                f"row name {name!r}: use letters, digits and -_+. only (it names folders)"
            )
        if names.count(name) > 1:
            raise ConfigError(f"row {name!r} is declared twice; give each row its own name")
    for key in study.data:
        if not key.startswith("data."):
            raise ConfigError(f"data={{{key!r}: ...}}: the study's data holds data.* keys only")
    if not isinstance(study.budget, int) or study.budget < 1:
        raise ConfigError(f"budget={study.budget!r}: give the candidates per row, at least 1")
    if study.budget > 1:
        for row in study.rows:
            if not row.space:
                raise ConfigError(
                    f"row {row.name!r} has no search space, but the budget gives every row "
                    f"{study.budget} candidates: give it space={{...}} over its own "
                    "hyperparameters (a baseline is tuned as much as the methods), or budget=1"
                )
    for row in study.rows:
        for key, dim in row.space.items():
            _check_dimension(row.name, key, dim)
        if study.sampler == "grid":
            _check_grid(row, study.budget)
    looks = tuple(study.looks)
    if (
        not looks
        or any(not isinstance(n, int) or n < 2 for n in looks)
        or list(looks) != sorted(set(looks))
    ):
        raise ConfigError(
            f"looks={looks!r}: give the seeds of each look, increasing, at least 2, e.g. (5, 10)"
        )
    if not 0.0 < study.alpha < 0.5:
        raise ConfigError(f"alpha={study.alpha!r}: give the design's error in (0, 0.5), e.g. 0.05")
    if study.family_by not in FAMILIES:
        raise ConfigError(
            f"family_by={study.family_by!r}; choose one of: {', '.join(FAMILIES)} (Holm's "
            "correction across every claim of the family, or within each paper's)"
        )
    if study.sampler not in SAMPLERS:
        raise ConfigError(f"sampler={study.sampler!r}; choose one of: {', '.join(SAMPLERS)}")
    if study.metric not in study.metrics:
        raise ConfigError(
            f"metric={study.metric!r} is not among metrics={study.metrics!r}; add it there"
        )
    if isinstance(study.selection, Folds) and study.selection.k < 2:
        raise ConfigError(f"Folds({study.selection.k}): give at least 2 folds, or Holdout()")
    texts = [c.text for c in study.claims]
    for claim in study.claims:
        if claim.fixed:
            _check_fixed(claim)
        for which in (claim.row,) if claim.fixed else (claim.row, claim.base):
            if which not in names:
                raise ConfigError(
                    f"claim {claim.text!r} names row {which!r}, which the study does not "
                    f"have; its rows: {', '.join(names)}"
                )
        if claim.row == claim.base:
            raise ConfigError(f"claim {claim.text!r} compares row {claim.row!r} with itself")
        if texts.count(claim.text) > 1:
            raise ConfigError(f"claim {claim.text!r} is declared twice; give each its own text")
        if claim.effect is not None and not math.isfinite(claim.effect):
            raise ConfigError(f"claim {claim.text!r}: effect must be a finite number or None")
        if claim.effects and (claim.effect is not None or claim.source):
            raise ConfigError(
                f"claim {claim.text!r} gives both effect/source and effects; give every "
                "effect in effects=(Effect(value, source), ...)"
            )
        for e in claim.effects:
            if not isinstance(e, Effect) or not math.isfinite(e.value) or not e.source:
                raise ConfigError(
                    f"claim {claim.text!r}: effects holds {e!r}; give Effect(value, source) with "
                    "a finite value in points and where the paper prints it"
                )


def _check_fixed(claim: Claim) -> None:
    from jdml.study.baselines import FIXED

    if claim.fixed not in FIXED:
        raise ConfigError(
            f"claim {claim.text!r}: fixed={claim.fixed!r}; choose one of: {', '.join(FIXED)}"
        )
    if claim.base:
        raise ConfigError(
            f"claim {claim.text!r} names both a base row {claim.base!r} and fixed="
            f"{claim.fixed!r}; give base='' to compare with the fixed baseline"
        )


def _check_grid(row: Row, budget: int) -> None:
    size = 1
    for key, dim in row.space.items():
        if not isinstance(dim, Choice):
            raise ConfigError(
                f"row {row.name!r}: sampler='grid' needs Choice spaces; {key!r} is a "
                f"{type(dim).__name__}: give its values as Choice((...)), or sampler='random'"
            )
        size *= len(dim.values)
    if budget > 1 and size < budget:
        raise ConfigError(
            f"row {row.name!r}'s grid has {size} combination(s), fewer than the budget "
            f"{budget} every row gets: add values to its Choices, or lower the budget"
        )


def _check_dimension(row: str, key: str, dim: object) -> None:
    if isinstance(dim, Choice):
        if not dim.values:
            raise ConfigError(f"row {row!r}: space[{key!r}] is a Choice of no values")
        return
    if isinstance(dim, Float | Int):
        if not dim.low < dim.high or (dim.log and dim.low <= 0):
            raise ConfigError(
                f"row {row!r}: space[{key!r}] needs low < high (and low > 0 on a log scale), "
                f"got {dim}"
            )
        return
    raise ConfigError(
        f"row {row!r}: space[{key!r}] is a {type(dim).__name__}; give Float(low, high), "
        "Int(low, high) or Choice((a, b, ...)) from jdml.study"
    )


def load(path: str, arg: str = "") -> Study:
    """The study that the file ``path``'s ``get_study(arg)`` returns (``path:arg`` splits
    the same way as a config file's argument), checked by :func:`check`.

    The study file is the user's Python, like a config file: running it is what the command
    asks for. Run folders and records are never executed.

    Raises:
      ConfigError: the file is missing, does not load or define ``get_study``, or the study
        does not pass :func:`check`.
    """
    if not arg and not os.path.isfile(path) and ":" in path:
        path, _, arg = path.partition(":")
    if not os.path.isfile(path):
        raise ConfigError(
            f"study file {path} does not exist; give a Python file whose get_study() returns "
            "a jdml.study.Study (e.g. experiments/glyph_study.py)"
        )
    spec = importlib.util.spec_from_file_location("_jdml_study_file", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigError(f"study file {path} does not parse: line {e.lineno}: {e.msg}") from None
    if not hasattr(module, "get_study"):
        raise ConfigError(f"study file {path} defines no get_study(); return a Study from it")
    try:
        study = module.get_study(arg) if arg else module.get_study()
    except ConfigError:
        raise
    except Exception as e:  # the file's own failure, in one line
        given = f" with argument {arg!r}" if arg else " (no argument: give one as FILE:ARG)"
        raise ConfigError(
            f"study file {path} failed in get_study(){given}: {type(e).__name__}: {e}"
        ) from None
    check(study)
    return study


# -- the configs of the runs ---------------------------------------------------------------------


def _from_spec(spec: str) -> ml_collections.ConfigDict:
    """The config of a ``configs/`` spec (``"revisiting:loss=margin"``) or a config file."""
    from jdml.cli import _read_config_file, config_file_problem, resolved_config_argv

    argv = resolved_config_argv([f"--config={spec}"], saved=False)
    config, error = _read_config_file(argv, "config")
    if error is not None:
        raise ConfigError(config_file_problem(argv, "config") or str(error))
    return config


def _builder_knobs(row: Row, values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if "." not in k}


def build_config(
    study: Study, row: Row, values: Mapping[str, Any] | None = None
) -> ml_collections.ConfigDict:
    """The config of ``row`` with the study's data and common keys, the row's overrides and
    the candidate's ``values`` (dotted keys set; the others passed to the row's builder)."""
    from jdml.keys import set_keys

    values = dict(values or {})
    knobs = {**row.defaults, **_builder_knobs(row, values)}
    if isinstance(row.config, str):
        c = _from_spec(row.config)
    elif isinstance(row.config, ml_collections.ConfigDict):
        c = ml_collections.ConfigDict(row.config.to_dict())
    else:
        takes = len(inspect.signature(row.config).parameters) > 0
        c = row.config(knobs) if takes else row.config()
    unknown = set(knobs) - set(row.defaults) if isinstance(row.config, str) else set()
    if unknown:
        raise ConfigError(
            f"row {row.name!r}: space keys {sorted(unknown)} are not config keys (dotted) and "
            "the row's config is a spec, not a builder that takes them"
        )
    with c.unlocked():
        set_keys(c, dict(study.data))
        set_keys(c, dict(study.common))
        set_keys(c, dict(row.overrides))
        set_keys(c, {k: _config_value(v) for k, v in values.items() if "." in k})
        c.eval.metrics = tuple(study.metrics)
        c.eval.selection_metric = study.metric
    return c


def _config_value(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def first_candidate(study: Study, row: Row) -> dict[str, Any]:
    """The row's own values of its space: a dotted key's from its config (the first choice if
    the config's value is not in a :class:`Choice`, clipped into a range), a knob's from
    ``row.defaults`` (else the first choice or the range's low end)."""
    from jdml.config import flatten_config

    flat = flatten_config(build_config(study, row).to_dict()) if row.space else {}
    out: dict[str, Any] = {}
    for key, dim in row.space.items():
        value = row.defaults.get(key, flat.get(key))
        if isinstance(dim, Choice):
            norm = [_jsonable(v) for v in dim.values]
            out[key] = dim.values[norm.index(_jsonable(value))] if _jsonable(value) in norm else (
                dim.values[0])  # fmt: skip
        elif value is None or isinstance(value, bool) or not isinstance(value, int | float):
            out[key] = dim.low
        else:
            clipped = min(max(value, dim.low), dim.high)
            out[key] = int(clipped) if isinstance(dim, Int) else float(clipped)
    return out


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=list))


def digest(payload: Any) -> str:
    """The sha256 of ``payload`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(text.encode()).hexdigest()


def registration(study: Study) -> dict[str, Any]:
    """What the study pre-registers: the claims (with their family membership and the
    papers' effects), the looks, the design's error, the metric and the stopping rule."""
    claims = []
    for c in study.claims:
        declared = dataclasses.asdict(c)
        if not declared["effects"]:  # a study declared before effects existed keeps its digest
            del declared["effects"]
        claims.append(declared)
    declared = {
        "claims": claims,
        "looks": list(study.looks),
        "alpha": study.alpha,
        "metric": study.metric,
        "stopping_rule": STOPPING_RULE,
    }
    if study.family_by != "table":  # a study declared before the choice keeps its digest
        declared["family_by"] = study.family_by
    return declared


def describe(study: Study, configs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The study as data (``DIR/study.json``), for the report, which never runs the file:
    its design and, per row, its label, space and resolved config (``configs``)."""
    return {
        "name": study.name,
        "rows": [
            {
                "name": r.name,
                "label": r.title,
                "space": {
                    k: {"kind": type(d).__name__, **dataclasses.asdict(d)}
                    for k, d in r.space.items()
                },
                "config": configs.get(r.name, {}),
            }
            for r in study.rows
        ],
        "data": _jsonable(dict(study.data)),
        "common": _jsonable(dict(study.common)),
        "selection": {"kind": type(study.selection).__name__, "folds": study.selection.folds()},
        "budget": study.budget,
        "tune": _jsonable(dict(study.tune)),
        "tune_seed": study.tune_seed,
        "sampler": study.sampler,
        "search_seed": study.search_seed,
        "metrics": list(study.metrics),
        "registration": registration(study),
    }
