"""`ddpfix verify`: the end state (endstate), a real Gloo all-reduce (torch) and the NCCL sweep (nccl)."""
