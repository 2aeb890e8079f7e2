"""Time scenarios (row 9): a skewed clock, chrony absent or unsynchronized, chrony configurations without a
drop-in directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddpfix.lab.model import LabPlan, NodePlan
from ddpfix.lab.scenarios.registry import last, scenario
from ddpfix.rules import time as time_rules

if TYPE_CHECKING:
    from ddpfix.lab.daemons import Runtime


FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SKEWED_PYTHON = "/etc/ddpfix-lab/python3-skewed"


def _install_skewed_python(rt: Runtime, node: NodePlan) -> None:
    rt.write_etc(
        node,
        "ddpfix-lab/python3-skewed",
        "#!/bin/sh\n# ddpfix lab (clock-skew): this node's userland clock reads 5 s ahead (libfaketime);\n"
        "# the kernel clock is untouched.\n"
        f'LD_PRELOAD={FAKETIME_LIB} FAKETIME=+5s exec /usr/bin/python3 "$@"\n',
        mode=0o755,
    )


@scenario(
    "clock-skew",
    "the highest-address node's clock, as its Python (Ansible's interpreter) reads it, is 5 s ahead (libfaketime)",
    (time_rules.SKEW.id,),
    min_nodes=2,
)
def _clock_skew(plan: LabPlan) -> None:
    """Failure mode: time without touching the one kernel clock all lab nodes share: on nodeN the interpreter
    Ansible runs (ansible_python_interpreter) is /usr/bin/python3 under libfaketime with FAKETIME=+5s, so every
    fact that node reports carries a wall clock 5 s ahead of the others. Finding: time_rules.SKEW (cluster-wide)."""
    node = last(plan)
    node.tasks.append(_install_skewed_python)
    node.hostvars["ansible_python_interpreter"] = SKEWED_PYTHON




@scenario(
    "chrony-absent",
    "no chronyd running on any node (the chrony package and its config stay in place)",
    (time_rules.NO_DAEMON.id,),
)
def _chrony_absent(plan: LabPlan) -> None:
    """Failure mode: time. No node runs chronyd (nor any other NTP client). The chrony package is
    installed (/usr is the host's) and each node's /etc/chrony keeps the lab configuration and
    `DAEMON_OPTS="-F 1 -x"` (so that starting it never touches the real clock).
    Finding: time_rules.NO_DAEMON on every node."""
    for n in plan.nodes:
        n.chrony = None


@scenario(
    "chrony-unsynced",
    "chronyd -x runs on the highest-address node, its only source an unused lab address: never synchronised",
    (time_rules.UNSYNCHRONIZED.id,),
)
def _chrony_unsynced(plan: LabPlan) -> None:
    """Failure mode: time, the daemon-but-no-sync variant. On nodeN chronyd runs (with the lab's
    `-F 1 -x`, so it never touches the clock) but its only source is `server <unused lab address>
    iburst`: the third address after the node addresses, which no node holds (NTP requests stay
    on the lab switch and are never answered). `chronyc tracking` shows leap status
    "Not synchronised". The lab starts this chronyd itself and records it as `chronyd-unsynced`,
    so `lab up` does not wait for it to synchronise. Finding: time_rules.UNSYNCHRONIZED on nodeN."""
    node = last(plan)
    node.chrony = None  # not the lab's own chronyd (which `up` waits to synchronise)
    node.files["chrony/conf.d/lab.conf"] = (
        f"# ddpfix lab (chrony-unsynced): an address nobody holds\nserver {plan.spare_address(3)} iburst\n"
    )
    node.tasks.append(_start_unsynced_chrony)


def _start_unsynced_chrony(rt: Runtime, node: NodePlan) -> None:
    rt.exec(node, ["/etc/init.d/chrony", "start"])
    rt.wait_for(lambda: rt.read_run(node, "chrony/chronyd.pid") is not None, 10, f"chronyd on {node.name}")
    rt.record_pidfile(node, "chronyd-unsynced", "/run/chrony/chronyd.pid")


HANDWRITTEN_CHRONY_CONF = """# Hand-written chrony configuration (ddpfix lab, {scenario}): no confdir, no include.
server {source} iburst
driftfile /var/lib/chrony/{drift}
makestep 1 3
"""


@scenario(
    "chrony-no-confdir",
    "the highest-address node's hand-written /etc/chrony/chrony.conf has no confdir/include; chronyd -x runs unsynced",
    (time_rules.UNSYNCHRONIZED.id,),
)
def _chrony_no_confdir(plan: LabPlan) -> None:
    """Issue 8 item 8 (a fix must reach the file the service reads). nodeN's /etc/chrony/chrony.conf is
    hand-written: one `server <unused lab address> iburst` (nobody answers), a driftfile and makestep, and
    no `confdir`/`include`, so nothing in /etc/chrony/conf.d is read (the lab's own conf.d/lab.conf is
    emptied to a comment there). chronyd runs with the lab's `-F 1 -x` (never touches the clock) and is
    recorded as `chronyd-unsynced`. Finding: time_rules.UNSYNCHRONIZED on nodeN; remediate must add a
    managed `confdir` line to that file, or its drop-in is never read."""
    node = last(plan)
    node.chrony = None
    node.files["chrony/chrony.conf"] = HANDWRITTEN_CHRONY_CONF.format(
        scenario="chrony-no-confdir", source=plan.spare_address(3), drift="chrony.drift"
    )
    node.files["chrony/conf.d/lab.conf"] = "# ddpfix lab (chrony-no-confdir): not read, chrony.conf has no confdir\n"
    node.tasks.append(_start_unsynced_chrony)


@scenario(
    "chrony-rhel-layout",
    "the highest-address node has RHEL's layout: chronyd -f /etc/chrony.conf (no confdir), no /etc/chrony/; unsynced",
    (time_rules.UNSYNCHRONIZED.id,),
)
def _chrony_rhel_layout(plan: LabPlan) -> None:
    """Issue 8 item 8, RHEL's layout. On nodeN chronyd reads /etc/chrony.conf (`-f /etc/chrony.conf` in
    /etc/default/chrony's DAEMON_OPTS, besides the lab's `-F 1 -x`), as RHEL's chronyd reads its
    compiled-in /etc/chrony.conf; that file has one `server <unused lab address> iburst`, a driftfile
    and makestep, and no confdir/include (RHEL's default reads no drop-in directory). /etc/chrony/ is
    removed from the node's /etc. chronyd runs unsynced, recorded as `chronyd-unsynced`.
    Finding: time_rules.UNSYNCHRONIZED on nodeN; the fix must write /etc/chrony.d and make /etc/chrony.conf read it."""
    node = last(plan)
    node.chrony = None
    node.files["chrony.conf"] = HANDWRITTEN_CHRONY_CONF.format(
        scenario="chrony-rhel-layout", source=plan.spare_address(3), drift="drift"
    )
    node.files["default/chrony"] = (
        "# ddpfix lab (chrony-rhel-layout): -x = never adjust the system clock; "
        'RHEL\'s configuration file\nDAEMON_OPTS="-F 1 -x -f /etc/chrony.conf"\n'
    )
    node.tasks.append(_remove_debian_chrony_dir)
    node.tasks.append(_start_unsynced_chrony)


def _remove_debian_chrony_dir(rt: Runtime, node: NodePlan) -> None:
    rt.exec(node, ["rm", "-rf", "--one-file-system", "/etc/chrony"])  # the node's private /etc copy
