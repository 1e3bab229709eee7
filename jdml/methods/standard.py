"""The Revisiting-DML setting (one head, one loss) is the general method with no auxiliary terms.

Kept as a name for code written against the single-head method; see ``jdml.methods.method``.
"""

from jdml.methods.method import Method as StandardMethod

__all__ = ["StandardMethod"]
