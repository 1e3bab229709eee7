"""Data: the datasets and their splits, the augmentations and the input pipeline.

Importing the package registers every augmentation in ``AUGMENTATIONS`` (the glyph ones of
:mod:`.augment`, the photo ones of :mod:`.photo_augment`) and every in-memory dataset in
``DATASETS`` (:mod:`.sources`, the emoji set of :mod:`.emoji` and any prepared
tensorflow-datasets image dataset, :mod:`.tfds_datasets`, which imports tensorflow-datasets
only when it reads).
"""

from jdml.data import (  # noqa: F401  (registration)
    augment,
    emoji,
    photo_augment,
    sources,
    tfds_datasets,
)
