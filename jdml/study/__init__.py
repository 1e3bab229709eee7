"""Studies: a fair comparison of methods as one command (``jdml study run`` / ``report``).

A study file declares the rows, the data, the selection split, one tuning budget for every
row, the seeds' looks and the pre-registered claims (:mod:`jdml.study.spec`); the runner tunes
on validation, trains the seeds and evaluates each on the test classes once
(:mod:`jdml.study.runner`), on this host's slots or a Ray cluster
(:mod:`jdml.study.executor`); the report reads the records only (:mod:`jdml.study.report`).
"""

from jdml.study.spec import Choice, Claim, Effect, Float, Folds, Holdout, Int, Row, Study

__all__ = ["Choice", "Claim", "Effect", "Float", "Folds", "Holdout", "Int", "Row", "Study"]
