"""Data: the datasets and their splits, the augmentations and the input pipeline.

Importing the package registers every augmentation in ``AUGMENTATIONS`` (the glyph ones of
:mod:`.augment`, the photo ones of :mod:`.photo_augment`) and every in-memory dataset in
``DATASETS`` (:mod:`.sources`, and the emoji set of :mod:`.emoji`).
"""

from jdml.data import augment, emoji, photo_augment, sources  # noqa: F401  (registration)
