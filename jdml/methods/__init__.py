"""Training methods: what is embedded, which loss terms are computed, and how they are weighted."""

from jdml.methods.method import Method
from jdml.methods.standard import StandardMethod

__all__ = ["Method", "StandardMethod"]
