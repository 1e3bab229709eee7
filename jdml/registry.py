"""Name -> object registries: every pluggable component is looked up by its reference name."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import numpy as np

from jdml.errors import UnknownNameError

T = TypeVar("T")
_NO_FACTS: Mapping[str, Any] = MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric setting accepts: ``low <= x <= high`` (``low < x`` with
    ``open_low``), integers only with ``integer`` (Python's or NumPy's, never a bool); every
    value must be finite."""

    low: float | None = None
    high: float | None = None
    integer: bool = False
    open_low: bool = False

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is refused (e.g. "must be at least 1"), or None if it is accepted."""
        if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
            return "must be a number"
        if self.integer and not isinstance(value, numbers.Integral):
            return "must be an integer"
        if not math.isfinite(value):
            return "must be finite"
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return f"must be {'above' if self.open_low else 'at least'} {self.low:g}"
        if self.high is not None and value > self.high:
            return f"must be at most {self.high:g}"
        return None


COUNT = Range(1, integer=True)
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, open_low=True)
PROBABILITY = Range(0, 1)


class Registry(Generic[T]):
    """A small name -> component table.

    Args:
      kind: what the registry holds ("loss", "miner", ...), used in error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._ranges: dict[str, dict[str, Range]] = {}
        self._meta: dict[str, MappingProxyType[str, Any]] = {}

    def register(
        self, name: str, *, ranges: Mapping[str, Range] | None = None, **meta: Any
    ) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; a duplicate name is an error.

        Args:
          name: the reference's name of the component.
          ranges: the values each numeric hyperparameter accepts (checked with the config).
          **meta: facts about the component that the rest of the library asks the registry
            for instead of keeping tables of its own (e.g. an augmentation's ``photo=True``).
        """

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            self._ranges[name] = dict(ranges or {})
            self._meta[name] = MappingProxyType(dict(meta))
            return obj

        return deco

    def unregister(self, name: str) -> None:
        """Removes ``name`` (a plug-in registered for a while, e.g. by a test); unknown: error."""
        self.get(name)
        del self._items[name], self._ranges[name], self._meta[name]

    def meta(self, name: str) -> Mapping[str, Any]:
        """The facts ``name`` was registered with (read-only; possibly none)."""
        self.get(name)
        return self._meta.get(name, _NO_FACTS)

    def names_where(self, key: str, value: Any = True) -> list[str]:
        """The sorted names registered with ``key=value`` in their facts."""
        return sorted(n for n, meta in self._meta.items() if meta.get(key) == value)

    def ranges(self, name: str) -> dict[str, Range]:
        """The declared ranges of ``name``'s numeric hyperparameters (possibly none)."""
        self.get(name)
        return self._ranges[name]

    def get(self, name: str) -> T:
        """Returns the component named ``name`` or raises an error listing the known names."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; known {self.kind} names: {known}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
