"""Checks of a method's config that need no data: its phases and its cohort (its heads:
``jdml.embedder.check_head_dims``).

``jdml.config.validate`` runs them before anything is read or written, so a mistake here stops
``train.py`` before the data load and before the run directory is created. ``Method`` and
``Program`` refuse the same mistakes (with the same messages) for a library user who builds them
from a config that was never validated.
"""

from __future__ import annotations

import ml_collections

from jdml.errors import ConfigError
from jdml.methods.terms import TERMS


def check_phases(config: ml_collections.ConfigDict) -> None:
    """Every ``phases`` entry is a non-empty set of the method's terms: ``main``,
    ``decorrelation`` and the names of the ``aux`` terms.

    Raises:
      ConfigError: naming the entry and the terms to choose from.
    """
    known = {"main", "decorrelation", *config.aux.keys()}
    for phase in config.phases:
        unknown = [t for t in phase if t not in known]
        if unknown or not phase:
            raise ConfigError(
                f"phases entry {tuple(phase)} names unknown term(s) {unknown}; choose from "
                f"{sorted(known)}"
            )


def check_stateless_members(config: ml_collections.ConfigDict) -> None:
    """A heterogeneous cohort (``cohort.members``) has no term that keeps a state between steps
    (its members' networks differ, so no state of one shape serves them all).

    Raises:
      ConfigError: naming the fixes.
    """
    if not config.cohort.members:
        return
    if any(TERMS.get(t.kind).stateful for t in config.aux.values()):
        raise ConfigError(
            "cohort.members (a heterogeneous cohort) with a term that keeps a state (DaNCE's "
            "key queue) is not supported; use identical members (cohort.members=()) or drop "
            "the DaNCE term"
        )
