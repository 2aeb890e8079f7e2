"""The ddpfix lab: real SSH hosts in Linux namespaces on this machine.

    from ddpfix import lab
    info = lab.up("t1", nodes=3, scenario="hostname-loopback", subnet="192.168.91.0/24",
                  inventory_dir=tmp_path)
    lab.node_exec("t1", "node3", ["getent", "ahosts", "node3"]).stdout
    lab.down("t1")

Layout of a lab named NAME (every name derives from NAME, so labs with different names and
subnets coexist):

- network namespaces `ddpfix-NAME-nodeI` (one per node) and `ddpfix-NAME-sw` (the switch: a
  bridge `br0` with one veth port per node NIC and an uplink);
- in the root namespace only one veth, `ddpl<hash of NAME>`, holding the subnet's first address,
  so the controller (Ansible, ssh, tests) reaches the nodes; the host does not forward;
- per node a PID 1 (`ddpfix-node`, see `_nodeinit.py`) in new mount/UTS/IPC/PID namespaces inside
  the node's network namespace, started with CAP_SYS_TIME removed from the bounding set; every
  later process of the node (sshd, chronyd -x, firewalld, ...) is started with `nsenter -t PID -a`
  under `setpriv --bounding-set -sys_time`, so nothing in the lab can set the real clock;
- state under `/run/ddpfix-lab/NAME/` on a tmpfs of its own: `lab.json` (plan, PIDs with their
  start times, what was written where), the controller key, `known_hosts`, `ssh_config`, logs and
  per node its `etc/` (a copy of the host's /etc, bind-mounted over the node's whole /etc),
  `run/`, `root/`, `log/`, `chrony/` and `machine-id`.

`down` kills only recorded PIDs (checked against their recorded start time), deletes the
namespaces and the uplink, unmounts and removes the state dir and the inventory file `up` wrote.

Modules, by concern (each imports only those listed before it): `model` (typed data), `scenarios` (failure modes
applied to a plan, one module per area), `system` (processes, files, namespaces, the state file), `prerequisites`,
`plan`, `network`, `daemons` (node PID 1, sshd, chronyd, running commands in a node), `nodefiles` (node file trees,
keys, client files, the inventory), `lifecycle` (up, info, status, down).
"""

from ddpfix.lab.daemons import (
    chrony_tracking,
    node_exec,
    node_popen,
    start_sshd,
    stop_sshd,
    wait_synchronised,
)
from ddpfix.lab.lifecycle import down, info, list_labs, status, status_dict, up
from ddpfix.lab.model import (
    DEFAULT_NAME,
    DEFAULT_NODES,
    DEFAULT_SUBNET,
    LabError,
    LabInfo,
    LabStatus,
    NodeInfo,
    NodeStatus,
    host_link,
    netns_name,
    state_dir,
    switch_netns,
)
from ddpfix.lab.network import free_subnet
from ddpfix.lab.plan import plan_lab
from ddpfix.lab.prerequisites import check_prerequisites
from ddpfix.lab.scenarios.registry import SCENARIOS
from ddpfix.lab.system import lab_mounts, pid_alive, ssh_banner

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_NODES",
    "DEFAULT_SUBNET",
    "SCENARIOS",
    "LabError",
    "LabInfo",
    "LabStatus",
    "NodeInfo",
    "NodeStatus",
    "check_prerequisites",
    "chrony_tracking",
    "down",
    "free_subnet",
    "host_link",
    "info",
    "lab_mounts",
    "list_labs",
    "netns_name",
    "node_exec",
    "node_popen",
    "pid_alive",
    "plan_lab",
    "ssh_banner",
    "start_sshd",
    "state_dir",
    "status",
    "status_dict",
    "stop_sshd",
    "switch_netns",
    "up",
    "wait_synchronised",
]
