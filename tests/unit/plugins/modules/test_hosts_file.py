"""The managed /etc/hosts block: roles/ddpfix_hosts/library/ddpfix_hosts_file.py `render` (pure, no host)."""

from __future__ import annotations

import pytest
from unit_helpers import hosts_file_module, nodeinfo, recorded

hf = hosts_file_module()
ENTRIES = [{"address": "192.168.77.11", "names": ["node1"]},
           {"address": "192.168.77.12", "names": ["node2"]},
           {"address": "192.168.77.13", "names": ["node3"]}]
BLOCK = [hf.BEGIN, hf.NOTE, "192.168.77.11\tnode1", "192.168.77.12\tnode2", "192.168.77.13\tnode3", hf.END]

DEBIAN = """127.0.0.1\tlocalhost
127.0.1.1\tnode2.example.com\tnode2

# The following lines are desirable for IPv6 capable hosts
::1     localhost ip6-localhost ip6-loopback
ff02::1 ip6-allnodes
ff02::2 ip6-allrouters
"""
DEBIAN_SHORT = "127.0.0.1\tlocalhost\n127.0.1.1\tnode2\n::1     localhost ip6-localhost ip6-loopback\n"
STALE = "127.0.0.1 localhost\n10.0.0.13 node3   # old network\n10.0.0.50 nfs-server\n"
DOCKER = "127.0.0.1\tlocalhost node2\n::1\tlocalhost ip6-localhost ip6-loopback\n172.17.0.5\t3f2a1b9c8d7e\n"

CORPUS = {"debian": DEBIAN, "debian-short": DEBIAN_SHORT, "stale": STALE, "docker": DOCKER,
          "empty": "", "recorded": recorded("etc-hosts.txt"), "no-final-newline": "127.0.0.1 localhost"}


def test_block_appended_after_existing_lines() -> None:
    text, removed = hf.render("127.0.0.1\tlocalhost\n", ENTRIES)
    assert text.splitlines() == ["127.0.0.1\tlocalhost", "", *BLOCK]
    assert removed == []


def test_own_hostname_removed_from_127_0_1_1_line_fqdn_kept() -> None:
    text, removed = hf.render(DEBIAN, ENTRIES)
    lines = text.splitlines()
    assert "127.0.1.1\tnode2.example.com" in lines
    assert removed == ["127.0.1.1\tnode2.example.com\tnode2"]
    assert lines[0] == "127.0.0.1\tlocalhost"
    assert "::1     localhost ip6-localhost ip6-loopback" in lines  # untouched, byte for byte
    assert lines[-len(BLOCK):] == BLOCK


def test_127_0_1_1_line_dropped_when_empty() -> None:
    text, removed = hf.render(DEBIAN_SHORT, ENTRIES)
    assert not any(ln.startswith("127.0.1.1") for ln in text.splitlines())
    assert removed == ["127.0.1.1\tnode2"]
    # and the result resolves node2 to its cluster address only
    parsed = nodeinfo().parse_hosts_file(text)
    assert [e["addr"] for e in parsed if "node2" in e["names"]] == ["192.168.77.12"]


def test_localhost_untouched_even_when_it_carried_the_hostname() -> None:
    text, removed = hf.render(DOCKER, ENTRIES)
    lines = text.splitlines()
    assert "127.0.0.1\tlocalhost" in lines
    assert "::1\tlocalhost ip6-localhost ip6-loopback" in lines
    assert "172.17.0.5\t3f2a1b9c8d7e" in lines
    assert removed == ["127.0.0.1\tlocalhost node2"]


def test_stale_peer_line_removed_others_kept() -> None:
    text, removed = hf.render(STALE, ENTRIES)
    assert "10.0.0.13" not in text
    assert "10.0.0.50 nfs-server" in text.splitlines()
    assert removed == ["10.0.0.13 node3   # old network"]


def test_comment_kept_when_line_keeps_names() -> None:
    text, _ = hf.render("10.0.0.13 node3 storage3 # rack 4\n", ENTRIES)
    assert text.splitlines()[0] == "10.0.0.13\tstorage3 # rack 4"


def test_commented_out_names_are_not_touched() -> None:
    text, removed = hf.render("#10.0.0.13 node3\n127.0.0.1 localhost # node2 was here\n", ENTRIES)
    assert text.splitlines()[:2] == ["#10.0.0.13 node3", "127.0.0.1 localhost # node2 was here"]
    assert removed == []


def test_existing_block_replaced_not_duplicated() -> None:
    old = "127.0.0.1 localhost\n" + hf.BEGIN + "\n10.0.0.11\tnode1\n" + hf.END + "\n10.0.0.50 nfs\n"
    text, removed = hf.render(old, ENTRIES)
    assert text.count(hf.BEGIN) == 1 and text.count(hf.END) == 1
    assert "10.0.0.11" not in text and "10.0.0.50 nfs" in text.splitlines()
    assert removed == []  # the old block is ours: replaced, not reported as a removed foreign line


def test_truncated_block_does_not_swallow_the_rest_of_the_file() -> None:
    broken = "127.0.0.1 localhost\n" + hf.BEGIN + "\n10.0.0.11\tnode1\n10.0.0.50 nfs\n"
    text, _ = hf.render(broken, ENTRIES)
    assert "10.0.0.50 nfs" in text.splitlines()
    assert text.count(hf.BEGIN) == 1
    assert hf.render(text, ENTRIES)[0] == text


def test_multiple_names_per_entry() -> None:
    entries = [{"address": "192.168.77.11", "names": ["gpu-a01", "node1"]}]
    text, _ = hf.render("127.0.1.1 gpu-a01\n", entries)
    assert "192.168.77.11\tgpu-a01 node1" in text.splitlines()
    assert "127.0.1.1" not in text


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_idempotent(name: str) -> None:
    once, _ = hf.render(CORPUS[name], ENTRIES)
    twice, removed = hf.render(once, ENTRIES)
    assert twice == once
    assert removed == []
    assert once.endswith(hf.END + "\n")


def test_changed_entries_rewrite_the_block() -> None:
    once, _ = hf.render(DEBIAN, ENTRIES)
    moved = [dict(e) for e in ENTRIES]
    moved[2] = {"address": "192.168.77.23", "names": ["node3"]}
    text, _ = hf.render(once, moved)
    assert "192.168.77.23\tnode3" in text and "192.168.77.13" not in text


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"address": "127.0.0.1", "names": ["localhost"]}, "reserved"),
        ({"address": "192.168.77.11", "names": ["localhost.localdomain"]}, "reserved"),
        ({"address": "::1", "names": ["ip6-localhost"]}, "reserved"),
        ({"address": "192.168.77.11", "names": ["evil\n10.0.0.1 x"]}, "RFC 1123"),
        ({"address": "192.168.77.11", "names": ["a b"]}, "RFC 1123"),
        ({"address": "192.168.77.11 x", "names": ["node1"]}, "not an IP address"),
    ],
)
def test_reserved_or_invalid_entries_are_refused(entry: dict, message: str) -> None:
    assert message in hf.entry_problem(entry)


def test_valid_entry_is_accepted() -> None:
    assert hf.entry_problem({"address": "192.168.77.11", "names": ["node1", "gpu-a.example.org"]}) is None
