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


def compact_labels(
    labels: np.ndarray, class_names: tuple[str, ...]
) -> tuple[np.ndarray, tuple[str, ...]]:
    """The labels present mapped onto 0..K-1 in sorted order, and the names of those classes.

    Args:
      labels: (N,) integer labels indexing ``class_names``.
      class_names: one name per label value.

    Returns:
      int32 (N,) labels and the K names they now index.
    """
    present = np.unique(labels)
    new = np.searchsorted(present, labels).astype(np.int32)
    return new, tuple(class_names[i] for i in present)


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
        labels, names = compact_labels(self.labels, self.class_names)
        return dataclasses.replace(self, labels=labels, class_names=names)


@dataclasses.dataclass(frozen=True)
class QueryGallery:
    """An evaluation split whose queries are ranked against a separate gallery (In-Shop).

    Seen as one :class:`ImageSet`, its images are the queries followed by the gallery, in one
    label space; the evaluator splits the embeddings at ``num_queries``
    (:func:`jdml.evaluation.embeddings.evaluate_embeddings` with a ``gallery``).

    Attributes:
      queries: the query images.
      gallery: the gallery images; labels index the same ``class_names`` as the queries'.
      source: where the split came from (for logs and results).
    """

    queries: Any
    gallery: Any
    source: str = ""

    def __post_init__(self) -> None:
        if tuple(self.queries.class_names) != tuple(self.gallery.class_names):
            raise ValueError("queries and gallery must share one label space (class_names)")

    @property
    def num_queries(self) -> int:
        return len(self.queries)

    @property
    def labels(self) -> np.ndarray:
        return np.concatenate([self.queries.labels, self.gallery.labels])

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(self.queries.class_names)

    @property
    def num_classes(self) -> int:
        return len(np.unique(self.labels))

    def __len__(self) -> int:
        return len(self.queries) + len(self.gallery)

    def _gather(self, index: np.ndarray, read: str) -> list[np.ndarray]:
        """``read`` ("load" or "eval_images") of the images ``index``, one array each."""
        index = np.asarray(index).reshape(-1)
        is_query = index < self.num_queries
        parts: list[np.ndarray | None] = [None] * len(index)
        for mask, part, offset in (
            (is_query, self.queries, 0),
            (~is_query, self.gallery, self.num_queries),
        ):
            if np.any(mask):
                images = getattr(part, read)(index[mask] - offset)
                for position, image in zip(np.flatnonzero(mask), images, strict=True):
                    parts[position] = image
        return parts  # type: ignore[return-value]

    def load(self, index: np.ndarray) -> list[np.ndarray]:
        """The raw uint8 images ``index`` (queries first, then the gallery)."""
        return self._gather(index, "load")

    def eval_images(self, index: np.ndarray) -> np.ndarray:
        """The images ``index`` as the evaluation sees them: float32 (n, H, W, C) in [0, 1]."""
        return np.stack(self._gather(index, "eval_images"))

    def subset(self, mask_or_index: np.ndarray) -> Any:
        raise TypeError(
            "a query/gallery split is evaluated as a whole; subset its queries or gallery"
        )

    def relabel(self) -> Any:
        raise TypeError("a query/gallery split keeps the shared labels of its queries and gallery")
