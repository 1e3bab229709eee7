"""Configs by job: :mod:`.schema` (every key and its default, the components' own keys read from
their registrations), :mod:`.validation` (checking a config once, before anything is read or
written, with the checks and choices the components registered) and :mod:`.saved` (a run's
``config.json`` and the keys that may change on resume). The names below are the package's
interface.

The package sits on top of the components: it imports them, and they import only the ground-floor
key helpers of :mod:`jdml.keys` (re-exported here), never this package.
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
