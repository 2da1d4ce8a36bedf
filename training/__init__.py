"""Drafter training: the block drafter learns from the target's own greedy answers.

Not a system path: nothing here is hashed into memory entries, and nothing in `stock/` or
`kernels/` imports it. The arrows go `training -> stock -> kernels` (the drafter's modules,
weights format and the target model are stock's; the inference side stays in
`stock/drafters/block*.py`).

    python -m training.block --out /tmp/toy --seed 0 --toy      # CPU, seconds

Modules:
- `training.cli`: the command (`python -m training.block`): flags, set-ups of the target and
  the prompts, answering the corpus, saving the weights with their manifest;
- `training.loop`: the training loop (features, blocks, loss, validation, checkpoints);
- `training.data`: the target's answers as training data (sharded, saved, merged);
- `training.prompts`: the prompt corpus, built from a seed;
- `training.loss`: the head and the weighted loss (compiled on CUDA);
- `training.dist`: data-parallel training over the GPUs of one host.
"""
