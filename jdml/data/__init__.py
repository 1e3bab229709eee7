"""Data: the datasets and their splits, the augmentations and the input pipeline.

Importing the package registers every augmentation in ``AUGMENTATIONS``: the glyph ones
(:mod:`.augment`) and the photo ones (:mod:`.photo_augment`).
"""

from jdml.data import augment, photo_augment  # noqa: F401  (register the augmentations)
