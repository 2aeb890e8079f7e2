"""Jinja filter: the arguments of one node's ddpfix_node_files call (remediate.yml's cluster-wide play), decided in
Python from what the play decided once (its run_once set_fact) and the node's own plan."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def ddpfix_node_files_args(run, plan):
    """The arguments of the node's ddpfix_node_files call, or None when it writes nothing (the task is skipped).

    `run` is what the play decided once (templated once, not per node): `failed` (nodes of the run that failed or
    were unreachable in the per-node play: then no node gets the hosts block and the env files, all nodes or none),
    `tags` (the run's --tags but 'all') and `skip_tags`, whether --tags names the hosts block's, the env files', the
    open-file limit's or the memlock limit's group (`hosts_tagged`, `env_tagged`, `nofile_tagged`,
    `memlock_tagged`), the hosts block's entries (`hosts`), `env_path`, `adopt`, the cluster file's text
    (`cluster_text`) and the node lock's settings (`lock_path`, `lock_holder`, `lock_stale_minutes`). `plan` is the
    node's HostPlan (`ddpfix_plan[inventory_hostname]`): hosts (bool), hosts_path, env (what the env file fixes),
    env_body, cluster_path, files (the limits drop-ins, each with its `key`)."""
    tags, skip = list(run.get("tags") or []), list(run.get("skip_tags") or [])

    def asked(group, tagged):  # the run writes this group: no --tags, or --tags names it; not --skip-tags
        return (not tags or bool(tagged)) and group not in skip

    keys = [k for k in ("nofile", "memlock") if asked(k, run.get(k + "_tagged"))]
    files = [f for f in (plan.get("files") or []) if f.get("key") in keys]
    whole = not run.get("failed")  # all nodes or none
    write_hosts = (whole and bool(plan.get("hosts")) and bool(run.get("hosts"))
                   and asked("hosts", run.get("hosts_tagged")))
    write_env = whole and bool(plan.get("env")) and asked("env", run.get("env_tagged"))
    if not (write_hosts or write_env or files):
        return None
    args = {
        "lock_path": run["lock_path"],
        "lock_holder": run["lock_holder"],
        "lock_stale_minutes": int(run["lock_stale_minutes"]),
        "adopt": bool(run.get("adopt")),
        "files": files,
    }
    if write_hosts:
        args["hosts"] = {"path": plan["hosts_path"], "entries": run["hosts"]}
    if write_env:
        args["env_path"] = run["env_path"]
        args["body"] = plan["env_body"]  # the block's body as the controller rendered it (the dry run's text too)
        if run.get("cluster_text"):  # the cluster file as the plan rendered it (once per run)
            args["cluster_file"] = {"path": plan["cluster_path"], "mode": "0644", "content": run["cluster_text"]}
    return args


class FilterModule:
    def filters(self):
        return {"ddpfix_node_files_args": ddpfix_node_files_args}
