"""Train a deep metric learning model, evaluating it on unseen classes.

  python train.py --config configs/revisiting.py --workdir runs/glyphs
  python train.py --config configs/revisiting.py:data=glyphs --workdir runs/x \
      --config.loss.name=triplet --config.miner.name=random --config.train.epochs=5

Running the same command again resumes from the newest checkpoint in --workdir.

Several hosts (one process each, same command, a workdir on a shared filesystem):

  python train.py --config configs/dm2.py --workdir /shared/dm2 \
      --coordinator_address=host0:1234 --num_processes=2 --process_id=0   # 1 on the other host
  python train.py --config configs/dm2.py --workdir /shared/dm2 --distributed   # SLURM / TPU pod
"""

from jdml.commands.train import run

if __name__ == "__main__":
    run()
