"""Where the inventory comes from: `-i` paths, an ad-hoc host list (`-i host1,host2,`), DDPFIX_INVENTORY; the
current Slurm allocation is `inventory.slurm`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import yaml

from ddpfix.ansible.rundirs import new_run_dir
from ddpfix.inventory.contract import BAD_HOST_CHARS, GROUP, refused


def split_inventory_env(value: str) -> tuple[str, ...]:
    """DDPFIX_INVENTORY: one inventory, several separated by commas, or an ad-hoc host list.

    The whole value names an existing path, or ends with a comma (Ansible's ad-hoc marker): one source.
    Otherwise it is split on commas when every part is an existing path; if any part is not, the whole
    value is one source (an ad-hoc host list `host1,host2`, checked like `-i host1,host2,`).
    """
    v = value.strip()
    if not v:
        return ()
    if os.path.exists(v) or v.endswith(","):
        return (v,)
    parts = [p.strip() for p in v.split(",") if p.strip()]
    if len(parts) > 1 and all(os.path.exists(p) for p in parts):
        return tuple(parts)
    return (v,)


def host_list_data(spec: str) -> dict[str, Any]:
    """Ansible's ad-hoc host list (`-i host1,host2:2222,`) as a YAML inventory: the hosts form group ddp_nodes."""
    # ansible-core loads slowly (CLI start): only for an ad-hoc host list
    from ansible.errors import AnsibleError
    from ansible.parsing.utils.addresses import parse_address

    hosts: dict[str, dict[str, Any]] = {}
    for item in (h.strip() for h in spec.split(",")):
        if not item:
            continue
        try:
            host, port = parse_address(item, allow_ranges=False)
        except AnsibleError:
            host, port = item, None
        if "/" in item:
            raise refused(f"inventory not found: {item} (in -i/--inventory {spec!r}; a path is not a host name)")
        if not host or BAD_HOST_CHARS & set(host) or any(ord(c) < 32 for c in host):
            raise refused(f"-i/--inventory {spec!r}: {item!r} is not a valid host name for an ad-hoc host list")
        hosts.setdefault(host, {} if port is None else {"ansible_port": int(port)})
    if not hosts:
        raise refused(f"-i/--inventory {spec!r}: the ad-hoc host list names no host")
    return {GROUP: {"hosts": hosts}}


def resolve_inventories(specs: Sequence[str]) -> tuple[str, ...]:
    """Paths for ansible: existing paths as given; an ad-hoc host list (a comma, no such path, as Ansible decides)
    becomes a YAML inventory file in a run directory of its own."""
    out: list[str] = []
    for spec in specs:
        if os.path.exists(spec) or "," not in spec:
            out.append(spec)  # a missing path is reported by list_inventory
            continue

        data = host_list_data(spec)
        path = new_run_dir("adhoc-inventory") / "hosts.yml"
        path.write_text(f"# ddpfix: ad-hoc host list -i {spec!r}\n" + yaml.safe_dump(data, sort_keys=False))
        out.append(str(path))
    return tuple(out)
