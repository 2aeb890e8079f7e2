"""explain names the earliest failure that is a cause; what follows it (store resets, watchdog timeouts,
ChildFailedError, SIGTERM to the other ranks) is its consequence. A job whose own failure (memory, data, code)
came first names no host check, whatever networking noise follows."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ddpfix.cli import cli
from ddpfix.diagnose.events import ERRNO_MEANING, errno_of, is_job_failure, layer_of
from ddpfix.diagnose.match import diagnose, explain

INIT = ["node1:2211:2211 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
        "node1:2211:2211 [0] NCCL INFO NET/IB : No device found.",
        "node1:2211:2211 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
        "node1:2211:2211 [0] NCCL INFO Using network Socket"]
TEARDOWN = ["W0501 10:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:858] Sending process 2212 "
            "closing signal SIGTERM",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]
RESET = ("[rank1]: torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving "
         "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: Connection reset "
         "by peer")
WATCHDOG = ("[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 "
            "milliseconds before timing out.")


def test_oom_first_names_no_host_check_whatever_follows() -> None:
    oom = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    ex = explain([*INIT, oom, RESET, WATCHDOG, "RuntimeError: Connection refused", *TEARDOWN])
    assert ex.diagnoses == [] and ex.job_first and ex.first is not None
    assert ex.first.line_no == 5 and ex.first.rank == 0 and ex.first.layer == "user"
    assert {e.key for e in ex.consequences} >= {"nccl-unique-id-closed", "collective-timeout-later"}
    assert any("ChildFailedError" in e.text for e in ex.consequences)


def test_ib_fallback_info_before_a_missing_dataset_names_nothing() -> None:
    missing = "[rank0]: FileNotFoundError: [Errno 2] No such file or directory: '/data/train.jsonl'"
    assert diagnose([*INIT, missing, *TEARDOWN]) == []
    assert [d.pattern.key for d in diagnose(INIT)] == ["nccl-ib-fallback"]  # alone it is still reported


def test_a_network_cause_first_makes_the_later_failures_its_consequences() -> None:
    refused = "socketStartConnect: Connect to 10.0.0.2<44801> failed : Connection refused"
    reset = "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer"
    ex = explain([INIT[0], refused, reset, WATCHDOG, "[rank1]: ValueError: bad batch", *TEARDOWN])
    assert [d.pattern.key for d in ex.diagnoses] == ["nccl-socket-connect"]
    assert ex.first is not None and ex.first.key == "nccl-socket-connect" and ex.first.errno == 111
    assert ex.first.peer == "10.0.0.2:44801" and ex.first.layer == "nccl-transport"
    kinds = [e.key or e.text[:20] for e in ex.consequences]
    assert "collective-timeout-later" in kinds and ex.n_consequences >= 4, kinds


def test_a_watchdog_timeout_alone_is_still_named() -> None:
    assert [d.pattern.key for d in diagnose([WATCHDOG, *TEARDOWN])] == ["collective-timeout-later"]


def test_a_failed_lookup_explains_the_connect_to_that_name_but_not_an_errno() -> None:
    gai = ("[W socket.cpp:558] [c10d] The IPv4 network addresses of (head-0, 50176) cannot be retrieved (gai error: "
           "-2 - Name or service not known).")
    summary = "[E socket.cpp:610] [c10d] The client socket has failed to connect to any network address of (head-0, 50176)."
    assert [d.pattern.key for d in diagnose([gai, summary])] == ["unresolvable-name"]
    other = summary.replace("head-0", "head-1")
    assert sorted(d.pattern.key for d in diagnose([gai, other])) == ["master-unreachable", "unresolvable-name"]


def test_distributed_value_errors_are_not_the_jobs_own() -> None:
    env = ("ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable "
           "MASTER_ADDR expected, but not set")
    assert not is_job_failure(env) and [d.pattern.key for d in diagnose([env])] == ["launch-env-missing"]
    assert is_job_failure("[rank0]: KeyError: 'input_ids'")
    assert is_job_failure("failed (exitcode: -9) local_rank: 0 (pid: 2211) of binary: /usr/bin/python3")


def test_layers_and_errnos() -> None:
    assert layer_of("[c10d] The client socket has failed to connect to [node1]:29500") == "store"
    assert layer_of("gloo/transport/tcp/pair.cc:144] no error") == "gloo"
    assert layer_of("NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>") == "nccl-bootstrap"
    assert layer_of("NCCL WARN NET/IB : Got completion from peer") == "nccl-transport"
    assert layer_of("Sending process 2212 closing signal SIGTERM by torchrun") == "launcher"
    for line, n in (("(errno: 113 - No route to host)", 113), ("gai error: -3 - Temporary failure", -3),
                    ("OSError: [Errno 98] Address already in use", 98), ("Connect to x failed : Connection refused", 111)):
        assert errno_of(line) == n and ERRNO_MEANING[n], line


def test_cli_says_the_job_failed_first_and_lists_the_consequences() -> None:
    log = "\n".join([*INIT, "[rank0]: torch.OutOfMemoryError: CUDA out of memory.", WATCHDOG, *TEARDOWN])
    r = CliRunner().invoke(cli, ["explain", "-"], input=log)
    assert r.exit_code == 0 and "the job failed first, not the network: no host check applies" in r.output
    assert "first failure: line 5, rank 0 (user)" in r.output and "consequences, not causes" in r.output
    assert "checked by" not in r.output and "ddpfix audit" not in r.output, r.output
    doc = json.loads(CliRunner().invoke(cli, ["explain", "-", "--format", "json"], input=log).stdout)
    assert doc["failures"] == [] and doc["events"]["job_first"] and doc["events"]["first"]["line"] == 5


def test_the_log_tells_the_interfaces_versions_and_store_address() -> None:
    from ddpfix.diagnose.hosts import read_hosts

    h = read_hosts(["node1:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0> [1]docker0:172.17.0.1<0>",
                    "node2:1:1 [0] NCCL INFO Bootstrap : Using eno1:avahi:169.254.3.4<0>",  # NCCL >= 2.4
                    "node3:1:1 [0] NCCL INFO NET : Using interface lo:127.0.0.1<0>",  # NCCL 2.3
                    "node2:2:2 [0] NCCL INFO NCCL version 2.18.1+cuda12.1",
                    "node1:2:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
                    "node1:2:2 [0] NCCL INFO NET/Plugin : Loaded net plugin NCCL RDMA Plugin v7 (v7)",
                    "The client socket has failed to connect to any network address of (34.1.2.3, 29500)."])
    assert [(i.who, i.name, i.kind) for i in h.interfaces] == [
        ("node1", "eth0", "private"), ("node1", "docker0", "bridge"), ("node2", "eno1:avahi", "link-local"),
        ("node3", "lo", "loopback")]
    assert h.differing() == {"nccl": {"node2": "2.18.1", "node1": "2.21.5"}}
    assert h.versions["net plugin"] == {"node1": "NCCL RDMA Plugin v7"} and h.stores == ["34.1.2.3:29500"]


def test_versions_that_differ_across_nodes_are_a_finding() -> None:
    from ddpfix.rules import env as env_rules
    from ddpfix.rules import fabric as fabric_rules

    lines = ["node1:2:2 [0] NCCL INFO NCCL version 2.18.1+cuda12.1", "node2:2:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
             "node1:2:2 [0] NCCL INFO Using network IB", "node2:2:2 [0] NCCL INFO Using network Socket", WATCHDOG]
    ds = diagnose(lines)
    assert [d.pattern.key for d in ds] == ["collective-timeout-later", "versions-differ"]
    v = ds[1]
    assert v.line_no == 1 and "nccl: node1 2.18.1, node2 2.21.5" in v.detail[0] and "network: node1 IB" in v.detail[0]
    assert set(v.pattern.finding_ids) == {env_rules.TORCH_VERSION_MISMATCH.id, fabric_rules.NCCL_VERSION_MISMATCH.id}
    assert diagnose(lines[:1] + lines[2:3]) == []  # one node, one version: nothing


def test_a_finding_names_one_or_two_checks_with_the_evidence() -> None:
    from ddpfix.rules import fabric as fabric_rules
    from ddpfix.rules import firewall as firewall_rules
    from ddpfix.rules import net as net_rules
    from ddpfix.rules import netif as netif_rules
    from ddpfix.rules import probes as probes_rules

    refused = "[W socket.cpp:697] [c10d] The client socket has failed to connect to [node1]:29500 (errno: 111 - Connection refused)."
    d = diagnose([refused])[0]
    assert d.checks == (probes_rules.MASTER_PORT_UNREACHABLE.id, firewall_rules.MASTER_PORT_BLOCKED.id)
    assert "errno 111: refused" in d.why
    public = "[c10d] The client socket has failed to connect to any network address of (34.1.2.3, 29500)."
    assert diagnose([public])[0].checks[0] == net_rules.MASTER_NOT_PRIVATE.id
    peer = "socketStartConnect: Connect to 10.0.0.2<44801> failed : Software caused connection abort"
    assert diagnose([peer])[0].checks == (firewall_rules.PEER_PORTS_BLOCKED.id, netif_rules.AUTOSELECT_WRONG.id)
    bridge = "node2:1:1 [0] NCCL INFO NET/Socket : Using [0]docker0:172.17.0.1<0>"
    d = next(x for x in diagnose([bridge, peer]) if x.pattern.key == "nccl-socket-connect")
    assert d.checks[0] == netif_rules.AUTOSELECT_WRONG.id and "node2 chose docker0 172.17.0.1 (bridge)" in d.why
    # a peer-to-peer refusal is not a master-port problem
    gloo = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect [192.168.0.222]:2226: Connection refused"
    assert diagnose([gloo])[0].checks == (firewall_rules.PEER_PORTS_BLOCKED.id, probes_rules.PEER_UNREACHABLE.id)
    ib = "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<50311> with status=12 opcode=0 len=0 vendor err 129"
    assert diagnose([ib])[0].checks == (fabric_rules.GID_INDEX_DIFFERS.id, fabric_rules.ROCE_NO_V2_GID.id)
    r = CliRunner().invoke(cli, ["explain", "-"], input=refused)
    want = f"look first at: {probes_rules.MASTER_PORT_UNREACHABLE.id}, {firewall_rules.MASTER_PORT_BLOCKED.id} (the"
    assert want in " ".join(r.output.split()), r.output


def test_hard_wrapped_lines_are_rejoined_with_their_launcher_prefix() -> None:
    wrapped = ["[rank3]: torch.distributed.DistNetworkError: The client socket has failed to connect to any network",
               "[rank3]: address of (node1, 29500). The client socket has failed to connect to node1:29500 (errno:",
               "[rank3]: 110 - Connection timed out)."]
    ds = diagnose(wrapped)
    assert [d.pattern.key for d in ds] == ["master-unreachable"] and ds[0].line_no == 1, [d.line for d in ds]
    assert ds[0].detail[:2] == ("node1", "29500")
    # a line that ends a sentence is not continued by the next one
    assert diagnose(["[rank3]: training step 10 done, loss 2.31 after a long epoch of many many batches.",
                     "[rank3]: address of (node1, 29500) is in the config"]) == []


def test_older_wordings_are_named() -> None:
    for line, key in (("NCCL WARN NET/Socket : no interface found", "socket-ifname-missing"),  # NCCL 2.3
                      ("NCCL WARN Net : No interface found in the same subnet as remote address 10.1.2.3<12345>",
                       "socket-ifname-missing"),
                      ("The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).",
                       "address-in-use"),  # torch 1.11-2.0's listen failure, pasted alone
                      ("The IPv4 network addresses of (master.cluster.example.org, 29500) cannot be retrieved (gai "
                       "error: -2 - Name or service not known).", "unresolvable-name")):
        assert [d.pattern.key for d in diagnose([line])] == [key], line
