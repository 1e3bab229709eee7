"""Train a deep metric learning model, evaluating it on unseen classes.

  python train.py --config configs/revisiting.py --workdir runs/glyphs
  python train.py --config configs/revisiting.py:data=glyphs --workdir runs/x \
      --config.loss.name=triplet --config.miner.name=random --config.train.epochs=5

Running the same command again resumes from the newest checkpoint in --workdir.
"""

from absl import app, flags
from ml_collections import config_flags

from jdml.cli import flags_parser, run_cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/<file>.py[:args]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it exists).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    del argv

    def run() -> None:
        from jdml.evaluation.evaluator import format_table
        from jdml.trainer import train_and_evaluate

        summary = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
        tables = {}
        for key in ("untrained", "best", "final"):
            for split, values in summary.get(key, {}).items():
                if isinstance(values, dict):
                    tables[f"{key} ({split})"] = values
        print(format_table(tables))
        print(f"results: {_WORKDIR.value}/results.json")

    run_cli(run)


if __name__ == "__main__":
    app.run(main, flags_parser=flags_parser())
