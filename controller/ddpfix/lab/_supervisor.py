# The lab's launcher: `python3 -I -c <this file> <json list of [argv, logfile]>`. Never imported.
# It starts one launcher per node and reaps them, so that nodes' wrapper processes do not become
# zombies of a PID 1 that does not reap; it exits when every node is gone.
import ctypes
import json
import os
import subprocess
import sys

ctypes.CDLL(None).prctl(15, b"ddpfix-lab", 0, 0, 0)  # PR_SET_NAME
for argv, log in json.loads(sys.argv[1]):
    with open(log, "ab") as out:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, close_fds=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
    except InterruptedError:
        continue
