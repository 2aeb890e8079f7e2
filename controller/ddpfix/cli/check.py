"""`ddpfix check --local`: a per-node check for Slurm Prolog/HealthCheckProgram, LBNL NHC or an init container."""

from __future__ import annotations

import os
import sys

import click

from ddpfix import clusterfile
from ddpfix import local as loc
from ddpfix.app import Application
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.rules.hosts import PEER_MISMATCH, PEER_UNRESOLVABLE

DEFAULT_CLUSTER_FILE = "/etc/ddpfix/cluster.json"


def _nhc(check_id: str, message: str) -> str:
    return f"ERROR: ddpfix: {check_id}: {' '.join(message.split())}"


@click.command("check")
@click.option("--local", "local", is_flag=True, help="Check this node, here (required: no SSH, no Ansible).")
@click.option("--cluster-file", type=click.Path(dir_okay=False), envvar="DDPFIX_CLUSTER_FILE",
              default=DEFAULT_CLUSTER_FILE, show_default=True,
              help="The cluster view written by `ddpfix env --apply` [env: DDPFIX_CLUSTER_FILE].")
@click.option("--node", metavar="NAME", help="This node's name in the cluster file (default: by hostname, then by "
                                              "the cluster address on its interfaces).")
@click.option("--timeout", type=click.FloatRange(min=0.5, max=3600), default=10.0, show_default=True,
              envvar="DDPFIX_CHECK_TIMEOUT", metavar="SECONDS",
              help="Total deadline: reading this node and resolving every peer (in parallel, each lookup at most "
                   "3 s); what is not decided by then is reported as not evaluated, exit 3 [env: "
                   "DDPFIX_CHECK_TIMEOUT].")
@click.option("--require-cluster-file", is_flag=True,
              help="A node without the cluster file fails (exit 2); by default it passes with a one-line note on "
                   "stderr (a node ddpfix never set up, e.g. under a site-wide Prolog, is not drained).")
@click.option("-v", "--verbose", "verbose", count=True, help="Every failure, one line each; OK line when healthy.")
@click.pass_obj
def command(app: Application, local: bool, cluster_file: str, node: str | None, timeout: float,
            require_cluster_file: bool, verbose: int) -> None:
    """Run the audit's checks that need only this node and the cluster file, in well under 2 s.

    Output and exit status follow LBNL NHC: healthy: exit 0, no output (-v: one OK line); a failure: one line
    `ERROR: ddpfix: <id>: <message>` (the first; -v: all) and exit 1; no cluster file: exit 0 with a note on
    stderr (--require-cluster-file: exit 2); a bad cluster file, or one that is not owned by root or is writable by
    group/others: exit 2; not decided within --timeout (a peer name that
    did not resolve in time, this node's facts not read in time): `ERROR: ddpfix: not-evaluated: ...`, exit 3.
    Checked: hostname not on loopback, peers resolve to their cluster addresses, the cluster interface exists,
    is up and in the CIDR, the env file exists and matches the cluster file, the firewall lets the cluster CIDR reach
    the master port and the ephemeral range, the time daemon is synchronised, the master port is outside the ephemeral
    range. Findings listed in the inventory's ddp_skip_findings are accepted (read only from a cluster file that passed
    the ownership check).
    """
    verbose = max(verbose, app.verbosity)
    if not local:
        raise DdpfixError("ddpfix check runs on the node itself: pass --local (ddpfix audit checks the whole cluster)",
                          ExitCode.INVALID_INPUT)

    if not require_cluster_file and not os.path.lexists(cluster_file):
        # a node ddpfix never set up: nothing to check against (a Prolog on every node must not drain it)
        click.echo(f"NOTE: ddpfix: no cluster file {cluster_file} on {os.uname().nodename} (`ddpfix env --apply` "
                   "writes it): nothing checked; --require-cluster-file makes this a failure", err=True)
        return
    try:
        cluster, doc = clusterfile.load(cluster_file)
        if node is not None and node not in cluster.names:
            raise DdpfixError(f"--node {node!r} is not in {cluster_file} ({', '.join(cluster.names)})",
                              ExitCode.INVALID_INPUT)
    except DdpfixError as exc:
        click.echo(_nhc("cluster-file", str(exc)))
        raise SystemExit(int(exc.code)) from None
    deadline = loc.Deadline(timeout)
    read, got = loc.within(lambda: loc.collect_local(cluster, doc, node), deadline)
    if not read or got is None:
        click.echo(_nhc("not-evaluated", f"nothing decided within {timeout:g} s: this node's facts were not read in "
                                         "time (a slow resolver or tool); not a pass"))
        sys.stdout.flush()
        raise SystemExit(int(ExitCode.RUN_FAILED))
    me, facts = got
    if not me:
        click.echo(_nhc("cluster-file", f"this node ({os.uname().nodename}) is not in {cluster_file}: none of its "
                                        "hostnames or addresses is listed (pass --node NAME)"))
        raise SystemExit(int(ExitCode.INVALID_INPUT))
    answers, undecided = loc.resolve_peers(doc, me, deadline)
    findings = loc.run_local(loc.local_context(cluster, doc, me, facts, answers), me)
    failed = loc.failures(findings)
    for f in failed[: None if verbose else 1]:
        click.echo(_nhc(f.id, f.message))
    if undecided and (verbose or not failed):
        shown = ", ".join(undecided[:10]) + (f" and {len(undecided) - 10} more" if len(undecided) > 10 else "")
        click.echo(_nhc("not-evaluated", f"peer name resolution not decided within {timeout:g} s (getaddrinfo did "
                                         f"not answer in time): {shown}; {PEER_UNRESOLVABLE.id} and "
                                         f"{PEER_MISMATCH.id} not evaluated for them, not a pass"))
    if failed:
        sys.stdout.flush()
        raise SystemExit(int(ExitCode.FINDINGS))
    if undecided:
        sys.stdout.flush()
        raise SystemExit(int(ExitCode.RUN_FAILED))
    if verbose:
        click.echo(f"OK: ddpfix: {me}: rank {cluster.node(me).rank} of {len(cluster.nodes)}, "
                   f"{len(loc.LOCAL_CHECKS)} check groups passed")
