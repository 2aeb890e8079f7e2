"""The node-side check of the firewalld changes a plan may carry (module_utils ddpfix_fw.fwd_changes): only the
cluster network, only ddpfix's two rich rules, only firewalld names; argv lists, never a string."""

from __future__ import annotations

import pytest

from ddpfix.ansible import collection

fw = collection.module_utils("ddpfix_fw")
fwd_argv, fwd_changes = fw.fwd_argv, fw.fwd_changes

CIDR = "192.168.83.0/24"
FROM = f'rule family="ipv4" source address="{CIDR}" accept'


def test_changes_checked_and_argv() -> None:
    got = fwd_changes([{"zone": "internal", "rich_rule": FROM}, {"zone": "", "source": CIDR}], CIDR, "trusted")
    assert got == [("zone", "internal", "rich-rule", FROM), ("zone", "trusted", "source", CIDR)]
    assert fwd_argv(got[0], "add", True) == ["firewall-cmd", "--permanent", "--zone=internal", f"--add-rich-rule={FROM}"]
    assert fwd_changes([], CIDR, "trusted") == [("zone", "trusted", "source", CIDR)]


@pytest.mark.parametrize("change", [
    {"zone": "trusted --add-source=0.0.0.0/0", "source": CIDR},
    {"zone": "../../../etc/shadow", "source": CIDR},
    {"policy": "a;b $(id)", "rich_rule": FROM},
    {"zone": "trusted", "source": "0.0.0.0/0"},
    {"zone": "trusted", "rich_rule": 'rule family="ipv4" source address="0.0.0.0/0" accept'},
    {"zone": "trusted", "rich_rule": FROM + " log"},
    {"policy": "p", "source": CIDR},
])
def test_anything_else_refused(change: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        fwd_changes([change], CIDR, "trusted")
