"""Host-side batch samplers, looked up by the reference's names.

Importing this package registers every sampler in ``SAMPLERS``.
"""

from jdml.samplers import class_random
from jdml.samplers.base import SAMPLERS, Sampler
from jdml.samplers.class_random import ClassRandomSampler

__all__ = ["SAMPLERS", "ClassRandomSampler", "Sampler", "class_random"]
