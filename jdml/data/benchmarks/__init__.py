"""Readers for the standard deep-metric-learning benchmarks in their official layouts.

A reader returns file lists (paths and labels), not decoded images; the input pipeline decodes
them (:func:`decode_image`). The splits are the usual unseen-class ones:

``cub200``
  CUB-200-2011: train classes 1-100, test 101-200 (:mod:`.cub`).
``cars196``
  Cars196: train classes 1-98, test 99-196 (:mod:`.cars`).
``sop``
  Stanford Online Products: its ``Ebay_train.txt`` / ``Ebay_test.txt`` (:mod:`.sop`).
``inshop``
  In-Shop Clothes Retrieval: train, query and gallery (:mod:`.inshop`).

Each is ``BENCHMARKS.get(name)(root, verify_counts=True, check_files=True)`` with ``root`` the
folder the archive unpacked to or its parent. ``TFDS_BENCHMARKS`` holds readers of the same
names for cub200, cars196 and sop prepared as tensorflow-datasets builders (:mod:`.tfds_sources`;
``root`` is the tfds data folder), which return the same splits; ``SOURCES`` maps
``data.source`` (``files``, ``tfds``) to the registry it reads from, and
``read_benchmark(name, root, source=...)`` looks a reader up there.

Importing the package imports every module in it, which registers each reader in
``BENCHMARKS``: a new benchmark only needs a module here with ``@BENCHMARKS.register``.
"""

import importlib
import pkgutil

from jdml.data.benchmarks.common import (
    BENCHMARKS,
    SOURCES,
    TFDS_BENCHMARKS,
    FileList,
    Photos,
    find_unreadable,
    read_benchmark,
)
from jdml.data.benchmarks.images import decode_image
from jdml.data.benchmarks.tfds_sources import TfdsSplit, tfds_source

__all__ = [
    "BENCHMARKS",
    "SOURCES",
    "TFDS_BENCHMARKS",
    "FileList",
    "Photos",
    "TfdsSplit",
    "decode_image",
    "find_unreadable",
    "read_benchmark",
    "tfds_source",
]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
