"""Evaluate a saved checkpoint of a training workdir on unseen classes.

python eval.py --workdir runs/glyphs                       # best checkpoint, test split
python eval.py --workdir runs/glyphs --checkpoint latest --split test --split val
python eval.py --workdir runs/glyphs --checkpoint 1200
"""

from jdml.commands.eval import run

if __name__ == "__main__":
    run()
