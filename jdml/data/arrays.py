"""In-memory labelled image arrays: the common form every data source is loaded into."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ImageArrays:
    """Images with integer class labels.

    Attributes:
      images: uint8 array (N, H, W, C).
      labels: int32 array (N,), values index ``class_names``.
      class_names: one readable name per class (e.g. the character, or the folder name).
      source: short description of where the data came from (for logs and results).
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.dtype != np.uint8:
            raise ValueError(
                f"images must be uint8 (N, H, W, C), got {self.images.dtype} {self.images.shape}"
            )
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"labels shape {self.labels.shape} does not match {self.images.shape[0]} images"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def subset(self, mask_or_index: np.ndarray) -> ImageArrays:
        """Returns the selected samples; labels keep their values (see ``relabel``)."""
        return dataclasses.replace(
            self, images=self.images[mask_or_index], labels=self.labels[mask_or_index]
        )

    def relabel(self) -> ImageArrays:
        """Maps the labels present onto 0..K-1 in sorted order (keeps class names aligned)."""
        present = np.unique(self.labels)
        new = np.searchsorted(present, self.labels).astype(np.int32)
        names = tuple(self.class_names[i] for i in present)
        return dataclasses.replace(self, labels=new, class_names=names)
