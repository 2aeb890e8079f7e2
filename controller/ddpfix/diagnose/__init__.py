"""Naming the known failure in a torchrun / torch.distributed / Gloo / NCCL log: the failures as data (patterns),
the types (model) and the matching (match); `ddpfix explain`, `verify`'s likely cause and the reports use it."""
