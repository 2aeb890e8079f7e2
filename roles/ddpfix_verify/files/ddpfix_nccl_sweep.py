"""An NCCL all-reduce sweep, one process per GPU, launched by torchrun on every node (`verify --backend nccl`).

Each rank times `iters` all-reduces per message size after a warm-up; the slowest rank's time counts (as nccl-tests
reports it). Local rank 0 of each node prints one `DDPFIX_NCCL_RESULT {json}` line with the times; the controller
computes algbw and busbw (ddpfix.verify.nccl), so the formula lives in one place.
"""

import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

PREFIX = "DDPFIX_NCCL_RESULT "


def emit(result: dict) -> None:
    """The result line in one write: torchrun starts its workers with `python -u`, where print() writes the text and
    its newline apart, so lines of processes sharing the node's stdout could join."""
    sys.stdout.write(PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def main() -> int:
    host = socket.gethostname()
    if not torch.cuda.is_available():
        error = f"torch.cuda.is_available() is False on {host}: no GPU for NCCL"
        emit({"ok": False, "hostname": host, "skipped": True, "error": error})
        return 3
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    timeout = float(os.environ.get("DDPFIX_PG_TIMEOUT", "60"))
    sizes = [int(x) for x in os.environ.get("DDPFIX_NCCL_SIZES", "8388608").split(",") if x]
    iters = int(os.environ.get("DDPFIX_NCCL_ITERS", "20"))
    warmup = int(os.environ.get("DDPFIX_NCCL_WARMUP", "5"))
    started = time.time()
    dist.init_process_group(backend="nccl", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    check = torch.ones(1024, device="cuda")
    dist.all_reduce(check)
    ok = bool(torch.all(check == world).item())
    sweep = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device="cuda")
        for _ in range(warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t = torch.tensor([(time.perf_counter() - t0) / iters], device="cuda", dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        sweep.append({"size": size, "seconds": t.item()})
        del x
    dist.barrier()
    dist.destroy_process_group()
    if local == 0:
        emit({"ok": ok, "rank": rank, "world_size": world, "hostname": host, "gpus": torch.cuda.device_count(),
              "sweep": sweep, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
              "seconds": round(time.time() - started, 2)})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
