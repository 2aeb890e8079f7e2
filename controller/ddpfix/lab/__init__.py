"""The ddpfix lab: real SSH hosts in Linux namespaces on this machine (see `core` for the layout).

    from ddpfix import lab
    info = lab.up("t1", nodes=3, scenario="hostname-loopback", subnet="192.168.91.0/24",
                  inventory_dir=tmp_path)
    lab.node_exec("t1", "node3", ["getent", "ahosts", "node3"]).stdout
    lab.down("t1")
"""

from ddpfix.lab.core import (
    chrony_tracking,
    check_prerequisites,
    down,
    free_subnet,
    info,
    lab_mounts,
    list_labs,
    node_exec,
    node_popen,
    pid_alive,
    plan_lab,
    ssh_banner,
    start_sshd,
    status,
    stop_sshd,
    up,
    wait_synchronised,
)
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
from ddpfix.lab.scenarios import SCENARIOS

__all__ = [
    "DEFAULT_NAME", "DEFAULT_NODES", "DEFAULT_SUBNET", "SCENARIOS", "LabError", "LabInfo", "LabStatus", "NodeInfo",
    "NodeStatus", "check_prerequisites", "chrony_tracking", "down", "free_subnet", "host_link", "info", "lab_mounts", "list_labs",
    "netns_name", "node_exec", "node_popen", "pid_alive", "plan_lab", "ssh_banner", "start_sshd", "state_dir",
    "status", "stop_sshd", "switch_netns", "up", "wait_synchronised",
]
