"""Training methods: what is embedded, which loss terms are computed, and how they are weighted."""

from jdml.methods.standard import StandardMethod

__all__ = ["StandardMethod"]
