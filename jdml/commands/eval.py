"""``jdml eval`` (and ``python eval.py``): evaluate a saved checkpoint of a training workdir on
unseen classes.

jdml eval --workdir runs/glyphs                       # best checkpoint, test split
jdml eval --workdir runs/glyphs --checkpoint latest --split test --split val
jdml eval --workdir runs/glyphs --checkpoint 1200
"""

from absl import app, flags

from jdml.allocator import reexec_with_tcmalloc
from jdml.cli import flags_parser, run_cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "best", "best, latest, or a step number.")
_SPLIT = flags.DEFINE_multi_string("split", ["test"], "Split(s) to evaluate: train, val, test.")
flags.mark_flags_as_required(["workdir"])


def main(argv: list[str]) -> None:
    del argv

    def run() -> None:
        from jdml.evaluate_checkpoint import (
            check_result_path,
            evaluate_checkpoint,
            load_config,
            save_evaluation,
        )
        from jdml.evaluation.table import format_table
        from jdml.workdir import check_writable

        load_config(_WORKDIR.value)  # a workdir that is not a run is named first
        check_writable(_WORKDIR.value)
        check_result_path(_WORKDIR.value, _CHECKPOINT.value)  # before the whole evaluation
        out = evaluate_checkpoint(_WORKDIR.value, _CHECKPOINT.value, _SPLIT.value, write=False)
        label = f"{out['checkpoint']} (step {out['step']})"
        rows = {f"{label} {s}": v for s, v in out["results"].items()}
        for split, embeddings in out.get("embeddings", {}).items():
            rows.update({f"{label} {split} {name}": v for name, v in embeddings.items()})
        print(format_table(rows), flush=True)  # shown even if the results cannot be written
        print("computed with: " + ", ".join(f"{k} {v}" for k, v in out["backends"].items()))
        print(f"results: {save_evaluation(_WORKDIR.value, out)}")

    run_cli(run)


def run(argv: list[str] | None = None) -> None:
    """Parses ``argv`` (default: ``sys.argv``) as the flags above and evaluates. As a program
    (``argv`` None) it first starts again under tcmalloc where installed (``jdml.allocator``)."""
    if argv is None:
        reexec_with_tcmalloc()
    app.run(main, argv=argv, flags_parser=flags_parser())
