"""Using a trained model: embed images with a checkpoint, build an index, search it.

``load(workdir)`` restores a checkpoint of a training run (its params and BatchNorm statistics
only: no training data, optimiser or sampler is built) and returns a :class:`Model` that embeds
images with one embedding of the run: its main head, another head (``shared``, ``member2``), a
weighted concatenation of the evaluated heads (``concat:0.5,1,1,1``, DiVA's evaluation) or, for
a DM2 cohort, ``ensemble`` (the concatenation of the members). :class:`Index` holds embeddings
with their labels and names and a fingerprint of the model that made them, and answers
nearest-neighbour queries with the jitted exact search of the evaluator; queries embedded by an
incompatible model are refused.

    model = jdml.load("runs/glyphs")
    index = model.index(images, labels=labels)
    hits = index.search(model.embed(queries), k=5, fingerprint=model.fingerprint)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from tqdm import tqdm

from jdml.backends import Backends, resolve_backends
from jdml.build import build_embeddings
from jdml.checkpoint import Checkpoints, storage_cause
from jdml.data.arrays import ImageSet
from jdml.data.benchmarks import BENCHMARKS
from jdml.data.benchmarks.images import decode_image
from jdml.data.sources import (
    IMAGE_SUFFIXES,
    NPZ_LAYOUT,
    image_files,
    npz_arrays,
    npz_images,
    npz_labels,
    read_image,
    resize_images,
)
from jdml.data.transforms import eval_view
from jdml.embedder import input_normalization
from jdml.errors import CheckpointError, DataError, IndexFileError, IndexMismatchError
from jdml.evaluation.embeddings import check_finite, combine_heads
from jdml.evaluation.knn import knn
from jdml.evaluation.splits import embed_split
from jdml.fileio import atomic_path, check_output_path

INDEX_FORMAT = "jdml-index-1"


@dataclasses.dataclass(frozen=True)
class Hit:
    """One neighbour of a query: its rank (1 = nearest), index position, name, label, distance."""

    rank: int
    index: int
    name: str
    label: int
    distance: float

    def as_dict(self, class_names: Sequence[str] = ()) -> dict[str, Any]:
        """The hit as JSON-ready values, with its class name when known."""
        out = dataclasses.asdict(self)
        if 0 <= self.label < len(class_names):
            out["class_name"] = class_names[self.label]
        return out


@dataclasses.dataclass(frozen=True)
class Collection:
    """Images to embed: file paths or an (N, H, W, C) array, with labels and names.

    Attributes:
      images: file paths, or uint8 images.
      labels: (N,) labels, or None when unlabelled.
      names: one name per image (its path, or ``#<i>`` for arrays).
      class_names: the name of each label.
    """

    images: list[str] | np.ndarray
    labels: np.ndarray | None
    names: list[str]
    class_names: tuple[str, ...] = ()


def _npz_collection(path: Path, model: Model) -> Collection:
    arrays = npz_arrays(path)
    if "images" not in arrays:
        raise DataError(f"{path} has no 'images' array; expected {NPZ_LAYOUT}")
    images = npz_images(arrays["images"], path)
    size, _, channels = model.input_shape
    images = resize_images(images, size, channels)
    labels = arrays.get("labels")
    if labels is not None:
        labels = npz_labels(labels, len(images), path)
    names = tuple(str(n) for n in arrays.get("class_names", ()))
    return Collection(images, labels, [f"#{i}" for i in range(len(images))], names)


def collect_images(
    source: str | Sequence[str], model: Model, *, files_only: bool = False
) -> Collection:
    """The images of a folder, an .npz, or a list of image files.

    A folder of class folders gives labels in sorted order of the folder names; a folder of
    images and a list of files give none; an .npz gives its 'images' (resized to the model's
    input if needed) and its optional 'labels' and 'class_names'.

    Args:
      source: a folder, an .npz file, or image files.
      model: the model (for the input size of .npz images).
      files_only: ``source`` is a list of image files (or a single .npz).

    Raises:
      DataError: a missing path, a folder without images, an unreadable .npz.
    """
    paths = [source] if isinstance(source, str) else list(source)
    if len(paths) == 1 and paths[0].endswith(".npz"):
        return _npz_collection(_existing(paths[0]), model)
    if files_only or len(paths) > 1:
        files = [str(_existing(p)) for p in paths]
        return Collection(files, None, files)
    folder = _existing(paths[0])
    if folder.is_file():
        return Collection([str(folder)], None, [str(folder)])
    classes = sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    per_class = [(d, image_files(d)) for d in classes]
    per_class = [(d, files) for d, files in per_class if files]
    if per_class:
        files = [str(f) for _, fs in per_class for f in fs]
        labels = np.repeat(np.arange(len(per_class)), [len(fs) for _, fs in per_class])
        return Collection(files, labels, files, tuple(d.name for d, _ in per_class))
    files = [str(f) for f in image_files(folder)]
    if not files:
        raise DataError(
            f"{folder} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}) and no class "
            "folders of images"
        )
    return Collection(files, None, files)


def _is_array(images: Any) -> bool:
    """Whether ``images`` is an array (NumPy, a ``jax.Array``, anything with ``__array__``)
    rather than a sequence of file names."""
    return isinstance(images, np.ndarray) or hasattr(images, "__array__")


def _existing(path: str) -> Path:
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist")
    return Path(path)


def hits_table(queries: Sequence[str], hits: Sequence[Sequence[Hit]], class_names=()) -> str:
    """The search results as text: per query, its neighbours with rank, distance, label, name."""
    lines = []
    for query, row in zip(queries, hits, strict=True):
        lines.append(f"query {query}")
        for hit in row:
            label = hit.as_dict(class_names).get("class_name", hit.label if hit.label >= 0 else "")
            lines.append(f"  {hit.rank:>3}  {hit.distance:9.4f}  {label!s:<12} {hit.name}")
    return "\n".join(lines)


def _digest(*parts: Any) -> str:
    """A short sha256 of JSON-serialisable parts."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _weights_digest(tree: Any) -> str:
    """A short sha256 over the bytes, shapes and dtypes of every leaf of a parameter tree."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        array = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}{array.shape}{array.dtype}".encode())
        h.update(array.tobytes())
    return h.hexdigest()[:16]


def _restore_raw(workdir: str, checkpoint: str | int) -> tuple[dict[str, Any], int]:
    """The saved train state of a checkpoint as nested dicts of arrays, and its step."""
    ckpts = Checkpoints(workdir, create=False)
    try:
        manager, step = ckpts.resolve(checkpoint)
        try:
            out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
        except Exception as e:  # orbax raises many types for unreadable files
            cause = storage_cause(e, f"Reading checkpoint step {step} from {manager.directory}")
            raise CheckpointError(
                f"cannot read checkpoint step {step} in {manager.directory} ({cause}). The "
                "files may be damaged; pass another --checkpoint (latest, best or a step number)"
            ) from None
    finally:
        ckpts.close()
    return dict(out["state"]), step


class Model:
    """One embedding of a trained checkpoint, as a jitted batched function of images.

    Attributes:
      workdir: the training run directory.
      config: the run's config.
      step: the checkpoint's step.
      embedding: the embedding spec (a head name, ``concat:<weights>`` or ``ensemble``).
      heads: the names of the run's embeddings (heads, or ``member<l>[/<head>]`` of a cohort).
      fingerprint: what an index records about the model that built it.
    """

    def __init__(
        self,
        workdir: str,
        config: ml_collections.ConfigDict,
        state: dict[str, Any],
        step: int,
        checkpoint: str | int,
        embedding: str | None = None,
    ) -> None:
        # The checkpoint holds the trained weights: the ImageNet file is neither read nor needed.
        config = ml_collections.ConfigDict(config.to_dict())
        config.model.pretrained = ""
        self.workdir, self.config, self.step = workdir, config, step
        # What it computes with, chosen once: the run's backends.*, else $JDML_CONV/KNN/KMEANS.
        self.backends = resolve_backends(config.get("backends"))
        # The run's networks alone: no losses, no class counts.
        self.embeddings = build_embeddings(config, self.backends)
        self.cohort_size = int(config.cohort.size)
        self._params = self.embeddings.network_params(state["params"])
        self._batch_stats = state["batch_stats"]
        self._embed_all = jax.jit(self.embeddings.embed)
        self.heads = self.embeddings.names
        self.embedding = embedding or self.embeddings.head
        self._combine = self.embeddings.parse(self.embedding)
        self._checkpoint = str(checkpoint)

    @functools.cached_property
    def fingerprint(self) -> dict[str, Any]:
        """What an index records about the model that built it (the weights are hashed on
        first use, not at load)."""
        return {
            "format": INDEX_FORMAT,
            "model": _digest(self.config.model.to_dict(), self.input_spec, self.cohort_size),
            "weights": _weights_digest((self._params, self._batch_stats)),
            "embedding": self.embedding,
            "workdir": os.path.abspath(self.workdir),
            "checkpoint": self._checkpoint,
            "step": int(self.step),
        }

    # -- images --------------------------------------------------------------------------------

    @property
    def input_spec(self) -> dict[str, Any]:
        """How images become the network's input (part of the fingerprint)."""
        d = self.config.data
        mean, std = input_normalization(self.config)
        spec = {
            "size": int(d.image_size),
            "channels": int(d.channels),
            "mean": np.asarray(mean).tolist(),
            "std": np.asarray(std).tolist(),
        }
        if d.name in BENCHMARKS:
            spec["resize"] = int(d.resize)  # photos: short side resized, centre crop
        return spec

    @property
    def input_shape(self) -> tuple[int, int, int]:
        d = self.config.data
        return int(d.image_size), int(d.image_size), int(d.channels)

    def read_image(self, path: str | Path) -> np.ndarray:
        """One image file as the evaluation sees it: float32 (H, W, C) in [0, 1].

        Photos of the benchmarks (CUB, CARS, SOP, In-Shop) get the evaluation view (the short
        side resized to ``data.resize``, the centre crop); other images are fitted into the
        square ``data.image_size`` with ``data.channels``, as the folder source reads them.
        """
        d = self.config.data
        if d.name in BENCHMARKS:
            photo = decode_image(str(path))
            view = eval_view(photo, int(d.resize), int(d.image_size), d.eval_interpolation)
            return view / 255.0
        return read_image(path, int(d.image_size), int(d.channels)).astype(np.float32) / 255.0

    def _as_input(self, images: np.ndarray) -> np.ndarray:
        """uint8 or [0, 1] float (N, H, W, C) images as float32, checked against the input."""
        images = np.asarray(images)
        if images.ndim == 3:
            images = images[..., None]
        if images.ndim != 4 or images.shape[1:] != self.input_shape:
            raise DataError(
                f"expected images of shape (N, {', '.join(map(str, self.input_shape))}) for this "
                f"model, got {images.shape}; pass file paths to have them resized"
            )
        if len(images) == 0:
            raise DataError("no images to embed (an empty array); pass at least one image")
        if images.dtype == np.uint8:
            return images.astype(np.float32) / 255.0
        if not np.issubdtype(images.dtype, np.floating):
            raise DataError(
                f"images of dtype {images.dtype}: pass uint8 levels 0..255 (e.g. "
                "images.astype(np.uint8)) or floats in [0, 1] (images / 255.0)"
            )
        low, high = float(np.min(images)), float(np.max(images))
        if not (np.isfinite(low) and np.isfinite(high) and low >= 0.0 and high <= 1.0):
            raise DataError(
                f"float images must lie in [0, 1], these span [{low:g}, {high:g}]: divide "
                "levels 0..255 by 255.0, or pass them as uint8"
            )
        return images.astype(np.float32)

    # -- embedding -----------------------------------------------------------------------------

    def embed_all(self, images: np.ndarray, batch_size: int = 256) -> dict[str, np.ndarray]:
        """Every embedding of the run (``{name: (N, dim)}``), in fixed-size jitted batches."""
        images = self._as_input(images)
        n = len(images)
        parts: dict[str, list[np.ndarray]] = {}
        size = max(1, min(batch_size, n))
        for start in range(0, n, size):
            chunk = images[start : start + size]
            valid = len(chunk)
            if valid < size:  # pad the last batch: one compiled shape
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], size - valid, axis=0)])
            out = self._embed_all(self._params, self._batch_stats, jnp.asarray(chunk))
            for name, emb in out.items():
                parts.setdefault(name, []).append(np.asarray(emb)[:valid])
        return {name: np.concatenate(chunks) for name, chunks in parts.items()}

    def embed_set(
        self, data: ImageSet, batch_size: int = 256, progress: bool = False
    ) -> dict[str, np.ndarray]:
        """Every embedding of a split of images, as the evaluation embeds it
        (:func:`jdml.evaluation.splits.embed_split`), with a progress bar if asked."""
        return embed_split(
            self._embed_all, self._params, self._batch_stats, data, batch_size, progress
        )

    def select(self, embeddings: dict[str, np.ndarray]) -> np.ndarray:
        """The model's embedding (``self.embedding``) from all of the run's embeddings.

        Raises:
          NonFiniteEmbeddingError: rows of it hold NaN or inf (counted in the message).
        """
        if self._combine is None:
            out = embeddings[self.embedding]
        else:
            out = np.asarray(combine_heads(embeddings, self._combine))
        where = f"{self.workdir}, checkpoint {self._checkpoint} (step {int(self.step)})"
        check_finite(out, f"{self.embedding!r} embeddings of {where}")
        return out

    def embed(
        self,
        images: np.ndarray | Sequence[str | Path],
        batch_size: int = 256,
        progress: bool = False,
    ) -> np.ndarray:
        """The model's embedding (``self.embedding``) of images or image files, float32 (N, D).

        Args:
          images: (N, H, W, C) uint8 or [0, 1] float images at the input size (a NumPy or JAX
            array, or any object with ``__array__``), or file paths (read batch by batch, so a
            large folder never sits in memory whole).
          batch_size: images per jitted call.
          progress: show a progress bar (files only).
        """
        if _is_array(images):
            return self.select(self.embed_all(np.asarray(images), batch_size))
        files = [str(p) for p in images]
        if not files:
            raise DataError("no images to embed (an empty list); pass at least one file")
        chunks = range(0, len(files), batch_size)
        parts = [
            self.select(
                self.embed_all(np.stack([self.read_image(f) for f in files[i : i + batch_size]]))
            )
            for i in tqdm(chunks, unit="batch", disable=not progress or len(chunks) < 2)
        ]
        return np.concatenate(parts)

    def export(self, path: str, platforms: Sequence[str] = ("cpu",)) -> dict[str, Any]:
        """Writes the model's embedding function, weights included, as a serialized
        ``jax.export`` module (``path``) and what it expects and returns as JSON
        (``path + ".json"``). The input is float32 images ``(batch, H, W, C)`` in [0, 1] for any
        batch size; the output ``(batch, dim)`` is the model's embedding (``self.embedding``).
        Running it needs only jax and numpy::

            exported = jax.export.deserialize(bytearray(open(path, "rb").read()))
            embeddings = exported.call(images)

        Args:
          path: the file to write (e.g. ``model.jaxexp``).
          platforms: the backends it runs on ("cpu", "cuda", "rocm", "tpu").

        Returns:
          The JSON description written next to it.

        Raises:
          OutputPathError: ``path`` or ``path + ".json"`` is a folder, a device or a link.
        """
        check_output_path(path, "model.jaxexp")
        check_output_path(path + ".json")
        params, stats, combine = self._params, self._batch_stats, self._combine

        # a portable module: XLA's convolutions, no custom calls
        portable = build_embeddings(self.config, self.backends.portable())

        def embed(images: jax.Array) -> jax.Array:
            out = portable.embed(params, stats, images)
            return out[self.embedding] if combine is None else combine_heads(out, combine)

        shape = jax.export.symbolic_shape("batch, {}, {}, {}".format(*self.input_shape))
        exported = jax.export.export(jax.jit(embed), platforms=tuple(platforms))(
            jax.ShapeDtypeStruct(shape, jnp.float32)
        )
        info = {
            "format": "jax.export",
            "input": {"shape": ["batch", *self.input_shape], "dtype": "float32", "range": [0, 1]},
            "output": {"shape": ["batch", int(exported.out_avals[0].shape[1])]},
            "platforms": list(exported.platforms),
            "embedding": self.embedding,
            "preprocessing": self.input_spec,
            "workdir": os.path.abspath(self.workdir),
            "checkpoint": self._checkpoint,
            "step": int(self.step),
        }
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(exported.serialize())
        with atomic_path(path + ".json") as tmp, open(tmp, "w") as f:
            json.dump(info, f, indent=2)
        return info

    def index(
        self,
        images: np.ndarray | Sequence[str | Path],
        *,
        labels: Sequence[int] | np.ndarray | None = None,
        names: Sequence[str] | None = None,
        class_names: Sequence[str] = (),
        batch_size: int = 256,
        progress: bool = False,
    ) -> Index:
        """Embeds a collection into an :class:`Index` (names default to the paths or
        ``#<i>``; labels to -1)."""
        if names is None:
            names = (
                [f"#{i}" for i in range(len(images))]
                if _is_array(images)
                else [str(p) for p in images]
            )
        embeddings = self.embed(images, batch_size, progress)
        labels = np.full(len(embeddings), -1) if labels is None else np.asarray(labels)
        return Index(
            embeddings=embeddings,
            labels=labels.astype(np.int64),
            names=tuple(names),
            class_names=tuple(class_names),
            fingerprint=dict(self.fingerprint),
            distance=str(self.config.eval.distance),
        )


@dataclasses.dataclass(frozen=True)
class Index:
    """Embeddings of a collection with their labels and names, and the fingerprint of the model
    that embedded them.

    Attributes:
      embeddings: float32 (N, D).
      labels: int64 (N,), -1 where unknown.
      names: one name per item (the file path, or ``#<i>``).
      class_names: the name of each label, if known.
      fingerprint: the building model's :attr:`Model.fingerprint`.
      distance: "euclidean" or "cosine", the run's evaluation distance.
    """

    embeddings: np.ndarray
    labels: np.ndarray
    names: tuple[str, ...]
    fingerprint: dict[str, Any]
    distance: str = "euclidean"
    class_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.embeddings)
        if self.embeddings.ndim != 2 or len(self.labels) != n or len(self.names) != n:
            raise IndexFileError(
                f"an index needs (N, D) embeddings with N labels and names, got "
                f"{self.embeddings.shape}, {len(self.labels)} labels, {len(self.names)} names"
            )

    def __len__(self) -> int:
        return len(self.embeddings)

    def check_compatible(self, fingerprint: dict[str, Any]) -> None:
        """Raises :class:`IndexMismatchError` unless ``fingerprint`` embeds into this index's
        space (the same model, weights and embedding)."""
        differ = [
            k
            for k in ("model", "weights", "embedding")
            if fingerprint.get(k) != self.fingerprint.get(k)
        ]
        if not differ:
            return

        def where(f: dict[str, Any]) -> str:
            return (
                f"{f.get('workdir')} ({f.get('checkpoint')}, step {f.get('step')}, "
                f"embedding {f.get('embedding')!r})"
            )

        raise IndexMismatchError(
            f"this index was built by {where(self.fingerprint)}, but the queries were embedded "
            f"by {where(fingerprint)}: their {', '.join(differ)} differ, so distances between "
            "them mean nothing. Embed the queries with the index's checkpoint and embedding, or "
            "rebuild the index with this one (python -m jdml embed ...)"
        )

    def search(
        self,
        queries: np.ndarray,
        k: int = 5,
        *,
        fingerprint: dict[str, Any] | None = None,
        backends: Backends | None = None,
    ) -> list[list[Hit]]:
        """The k nearest items of each query embedding (exact, jitted; ties by lower index).

        Args:
          queries: (Q, D) query embeddings.
          k: neighbours per query (at most the index size).
          fingerprint: the fingerprint of the model that embedded the queries; checked
            against the index's (pass ``model.fingerprint``).
          backends: the kNN selection (``model.backends``); None: resolved here, once, from
            the environment (:func:`jdml.backends.resolve_backends`).
        """
        if fingerprint is not None:
            self.check_compatible(fingerprint)
        queries = np.asarray(queries, np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.embeddings.shape[1]:
            raise IndexMismatchError(
                f"queries of shape {queries.shape} do not match the index's "
                f"{self.embeddings.shape[1]}-dimensional embeddings"
            )
        check_finite(self.embeddings, "embeddings of this index")
        check_finite(queries, "query embeddings")
        k = min(k, len(self))
        selection = (resolve_backends() if backends is None else backends).knn
        distances, indices = knn(
            queries,
            self.embeddings,
            k,
            exclude_self=False,
            distance=self.distance,
            selection=selection,
        )
        distances, indices = np.asarray(distances), np.asarray(indices)
        return [
            [
                Hit(rank + 1, int(i), self.names[i], int(self.labels[i]), float(d))
                for rank, (i, d) in enumerate(zip(row_i, row_d, strict=True))
            ]
            for row_i, row_d in zip(indices, distances, strict=True)
        ]

    def save(self, path: str | Path) -> None:
        """Writes the index as an ``.npz`` (no pickled objects), atomically."""
        path = Path(path)
        with atomic_path(path, ".npz") as tmp:
            np.savez(
                tmp,
                embeddings=self.embeddings.astype(np.float32),
                labels=self.labels.astype(np.int64),
                names=np.asarray(self.names, dtype=np.str_),
                class_names=np.asarray(self.class_names, dtype=np.str_),
                meta=np.asarray(
                    json.dumps({"fingerprint": self.fingerprint, "distance": self.distance})
                ),
            )

    @classmethod
    def load(cls, path: str | Path) -> Index:
        """Reads an index written by :meth:`save` (never unpickles anything)."""
        try:
            with np.load(path, allow_pickle=False) as npz:
                meta = json.loads(str(npz["meta"]))
                index = cls(
                    embeddings=npz["embeddings"].astype(np.float32),
                    labels=npz["labels"],
                    names=tuple(str(n) for n in npz["names"]),
                    class_names=tuple(str(n) for n in npz["class_names"]),
                    fingerprint=dict(meta["fingerprint"]),
                    distance=str(meta["distance"]),
                )
        except FileNotFoundError:
            raise IndexFileError(
                f"no index file at {path}; build one with python -m jdml embed"
            ) from None
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
            raise IndexFileError(
                f"{path} is not a readable jdml index ({e}); rebuild it with python -m jdml embed"
            ) from None
        if index.fingerprint.get("format") != INDEX_FORMAT:
            raise IndexFileError(
                f"{path} has index format {index.fingerprint.get('format')!r}, expected "
                f"{INDEX_FORMAT!r}; rebuild it with python -m jdml embed"
            )
        return index


def load(
    workdir: str | Path, checkpoint: str | int = "best", embedding: str | None = None
) -> Model:
    """Loads a trained model from a run directory.

    Args:
      workdir: a training run directory (with ``config.json`` and checkpoints).
      checkpoint: "best", "latest" or a step number.
      embedding: a head name, ``concat:<weights>`` over ``eval.heads``, or ``ensemble`` for a
        cohort; default the run's main head (a cohort's first member).

    Returns:
      The :class:`Model`.

    Raises:
      CheckpointError: no such run or checkpoint, or an unreadable one.
      ConfigError: an unknown embedding.
    """
    from jdml.evaluate_checkpoint import load_config

    workdir = str(workdir)
    config = load_config(workdir)
    state, step = _restore_raw(workdir, checkpoint)
    return Model(workdir, config, state, step, checkpoint, embedding)
