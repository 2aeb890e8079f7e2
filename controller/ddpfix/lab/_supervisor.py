# The lab's launcher: `python3 -I -c <this file> <path of a JSON list of [argv, logfile]>`. Never imported.
# (A file, not an argument: one argument is capped at 128 KiB, about 27 nodes' worth.)
# It starts one launcher per node and reaps them, so that nodes' wrapper processes do not become
# zombies of a PID 1 that does not reap; it exits when every node is gone.
import ctypes
import json
import os
import subprocess
import sys

ctypes.CDLL(None).prctl(15, b"ddpfix-lab", 0, 0, 0)  # PR_SET_NAME
with open(sys.argv[1]) as f:
    launches = json.load(f)
for argv, log in launches:
    with open(log, "ab") as out:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, close_fds=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
    except InterruptedError:
        continue
