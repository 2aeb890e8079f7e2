"""testinfra reaches lab nodes through the lab's Ansible inventory and through its ssh config."""

from __future__ import annotations

import os
import sys

import pytest
import testinfra


@pytest.mark.lab
def test_testinfra_through_ansible_inventory(clean_lab, monkeypatch: pytest.MonkeyPatch) -> None:
    # testinfra runs `ansible-inventory`/`ansible`: find them next to this interpreter (venv not activated)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    hosts = testinfra.get_hosts(["ansible://ddp_nodes"], ansible_inventory=str(clean_lab.inventory))
    assert sorted(h.backend.get_hostname() for h in hosts) == [n.name for n in clean_lab.nodes]
    for host in hosts:
        node = clean_lab.node(host.backend.get_hostname())
        assert host.file("/etc/hostname").content_string.strip() == node.hostname
        assert host.socket(f"tcp://{node.address}:22").is_listening


@pytest.mark.lab
def test_testinfra_through_ssh_config(clean_lab) -> None:
    for node in clean_lab.nodes:
        host = testinfra.get_host(f"ssh://{node.name}", ssh_config=str(clean_lab.ssh_config))
        assert host.check_output("hostname") == node.hostname
        hosts_file = host.file("/etc/hosts")
        for peer in clean_lab.nodes:
            assert f"{peer.address}\t{peer.hostname}" in hosts_file.content_string
        assert host.interface(node.ifname).addresses[0] == node.address
        assert host.process.get(pid=1).comm == "ddpfix-node"
        assert host.socket(f"tcp://{node.address}:22").is_listening
        assert not host.socket("tcp://0.0.0.0:22").is_listening  # sshd listens on the lab address only
