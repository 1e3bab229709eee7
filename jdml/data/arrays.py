"""In-memory labelled image arrays, and the interface every split of images offers.

A split (:class:`ImageArrays` in memory, or a list of image files such as
``jdml.data.benchmarks.FileList``) has ``labels``, ``class_names``, ``subset``, ``relabel``,
``load(index)`` (the raw uint8 images, for the training augmentation) and
``eval_images(index)`` (float32 images in [0, 1] as the evaluation sees them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np


class ImageSet(Protocol):
    """What the pipeline, the samplers and the evaluator need of a split of labelled images."""

    labels: np.ndarray
    class_names: tuple[str, ...]
    source: str

    def __len__(self) -> int: ...

    @property
    def num_classes(self) -> int: ...

    def subset(self, mask_or_index: np.ndarray) -> Any: ...

    def relabel(self) -> Any: ...

    def load(self, index: np.ndarray) -> Any:
        """uint8 images: an (n, H, W, C) array, or a list of arrays of their own sizes."""
        ...

    def eval_images(self, index: np.ndarray) -> np.ndarray:
        """float32 (n, H, W, C) in [0, 1], one size for the whole split."""
        ...


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

    def load(self, index: np.ndarray) -> np.ndarray:
        """The images ``index`` as uint8 (n, H, W, C)."""
        return self.images[index]

    def eval_images(self, index: np.ndarray) -> np.ndarray:
        """The images ``index`` as the evaluation sees them: float32 (n, H, W, C) in [0, 1]."""
        return self.images[index].astype(np.float32) / 255.0

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
