"""Where a run's retrieval errors come from on the emoji set: does a wrong nearest neighbour
share the query's design (style) or its concept?

For each run directory and embedding (a head, ``concat:<weights>`` or ``ensemble``, as
``jdml look`` takes them), embeds the test split with the selected checkpoint and prints, over
all test queries (each image against every other): Recall@1, the share of wrong first
neighbours drawn by the query's own design, and that share if wrong neighbours were drawn at
random from the other classes (chance). An embedding that encodes the drawing style more than
the concept pulls same-design neighbours: its share rises above chance. The emoji designs are
read from the built dataset (``python -m jdml data fetch emoji``).

Usage: python experiments/emoji_design_errors.py RUN[:EMBEDDING] [RUN[:EMBEDDING] ...]
   e.g. python experiments/emoji_design_errors.py runs/emoji-45/diva-DI/seed2:discriminative \
            runs/emoji-45/diva-DI/seed2:concat:1,1
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from jdml.allocator import reexec_with_tcmalloc
from jdml.data.emoji import read_cache
from jdml.data.loading import load_splits
from jdml.data.splits import class_halves
from jdml.errors import CheckpointError, ConfigError, DataError, WorkdirError
from jdml.evaluation.knn import knn
from jdml.inference import load


def test_designs(labels: np.ndarray, designs: np.ndarray, num_test: int) -> np.ndarray:
    """The design of every test image, in the test split's order: the split keeps the images of
    the test half of the classes in their dataset order (``jdml.data.splits``)."""
    test = np.isin(labels, class_halves(labels)[1])
    if int(test.sum()) != num_test:
        raise DataError(
            f"the test split has {num_test} images, the emoji cache {int(test.sum())}: the run "
            "was not trained on this build of the emoji set"
        )
    return designs[test]


def design_errors(
    embeddings: np.ndarray, labels: np.ndarray, designs: np.ndarray, distance: str = "euclidean"
) -> dict[str, float]:
    """Recall@1, the share of wrong first neighbours of the query's design, and its chance
    level (the share of the query's design among the other classes' images, averaged over the
    wrongly answered queries)."""
    labels, designs = np.asarray(labels), np.asarray(designs)
    _, found = knn(embeddings, embeddings, 1, exclude_self=True, distance=distance)
    first = np.asarray(found)[:, 0]
    wrong = labels[first] != labels
    same = designs[first] == designs
    # per query: the other classes' images of its design over the other classes' images
    pair = labels * (int(designs.max()) + 1) + designs
    of_design = np.bincount(designs)[designs] - np.bincount(pair)[pair]
    chance = of_design / (len(labels) - np.bincount(labels)[labels])
    if not wrong.any():
        return {"recall@1": 1.0, "same_design": 0.0, "chance": 0.0}
    return {
        "recall@1": float(np.mean(~wrong)),
        "same_design": float(np.mean(same[wrong])),
        "chance": float(np.mean(chance[wrong])),
    }


def main() -> int:
    reexec_with_tcmalloc()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="RUN[:EMBEDDING]")
    parser.add_argument("--checkpoint", default="best")
    args = parser.parse_args()
    try:
        arrays, _ = read_cache()
        print(
            "| run | embedding | recall@1 | wrong first neighbours of the query's design | chance |"
        )
        print("|---|---|---|---|---|")
        for spec in args.runs:
            workdir, _, embedding = spec.partition(":")
            model = load(workdir, args.checkpoint, embedding or None)
            test = load_splits(model.config.data)["test"]
            designs = test_designs(arrays["labels"], arrays["designs"], len(test))
            emb = model.select(model.embed_set(test, int(model.config.eval.batch_size)))
            r = design_errors(
                emb, np.asarray(test.labels), designs, str(model.config.eval.distance)
            )
            print(
                f"| {workdir} | {model.embedding} | {100 * r['recall@1']:.2f} | "
                f"{100 * r['same_design']:.1f} % | {100 * r['chance']:.1f} % |",
                flush=True,
            )
    except (CheckpointError, ConfigError, DataError, WorkdirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
