"""Configs by job: :mod:`.schema` (every key and its default; setting keys), :mod:`.validation`
(checking a config once, before anything runs) and :mod:`.saved` (a run's ``config.json`` and the
keys that may change on resume). The names below are the package's interface.
"""

from jdml.config.saved import (
    RESUMABLE_CHANGES,
    flatten_config,
    from_json,
    incompatible_keys,
    saved_config,
    selected_only,
    to_json,
)
from jdml.config.schema import (
    apply_overrides,
    base_config,
    component_defaults,
    dance_term,
    decorrelation_section,
    metric_term,
    parse_assignments,
    set_keys,
)
from jdml.config.validation import NUMERIC_KEYS, validate

__all__ = [
    "NUMERIC_KEYS",
    "RESUMABLE_CHANGES",
    "apply_overrides",
    "base_config",
    "component_defaults",
    "dance_term",
    "decorrelation_section",
    "flatten_config",
    "from_json",
    "incompatible_keys",
    "metric_term",
    "parse_assignments",
    "saved_config",
    "selected_only",
    "set_keys",
    "to_json",
    "validate",
]
