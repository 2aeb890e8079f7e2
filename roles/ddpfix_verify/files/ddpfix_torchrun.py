"""torchrun inside ddp_python, wherever that interpreter runs (the host, a container image): `python -c THIS CODE
KEY=VALUE... -- TORCHRUN_ARGS...`. The worker's code comes as an argument, not a file, and the env file's values come
as KEY=VALUE arguments, not the environment, so a container runtime that shares neither the host's files nor its
environment (`docker run --rm --network host IMAGE python3`) runs the same all-reduce as the host's python3. torchrun
then starts each worker as this same interpreter (`--no-python sys.executable -c CODE`)."""

import os
import runpy
import sys


def main() -> None:
    args = sys.argv[1:]
    if "--" not in args or not args:
        sys.exit("ddpfix_torchrun: usage: python -c BOOT CODE KEY=VALUE... -- TORCHRUN_ARGS...")
    code, sep = args[0], args.index("--")
    for kv in args[1:sep]:
        key, _, value = kv.partition("=")
        os.environ[key] = value
    sys.argv = ["torchrun", "--no-python", *args[sep + 1:], sys.executable, "-c", code]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


main()
