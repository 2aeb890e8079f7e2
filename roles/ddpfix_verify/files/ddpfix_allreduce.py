"""A real torch.distributed all-reduce (Gloo, CPU), launched by torchrun on every node."""

import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def emit(result: dict) -> None:
    """The result line in one write: torchrun starts its workers with `python -u`, where print() writes the text and
    its newline apart, so the ranks of one node sharing its stdout could join their lines into one."""
    sys.stdout.write("DDPFIX_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def main() -> int:
    started = time.time()
    timeout = float(os.environ.get("DDPFIX_PG_TIMEOUT", "20"))
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    want = world * (world + 1) / 2
    ok = abs(t.item() - want) < 1e-6
    dist.barrier()
    dist.destroy_process_group()
    emit({"rank": rank, "world_size": world, "sum": t.item(), "expected": want, "ok": ok,
          "hostname": socket.gethostname(), "seconds": round(time.time() - started, 2)})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
