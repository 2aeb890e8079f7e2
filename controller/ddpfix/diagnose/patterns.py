"""The failures `ddpfix explain` names, as data: `PATTERNS`, one row per failure, the table `explain`, `verify` (the
cause of a failing all-reduce) and the reports use. A row names the finding ids whose checks look at the cause
(`explain -i INV` runs the audit for them) and an example line (the README's generated list; a unit test matches it).
The host-limit and RDMA rows live in `patterns_host`.

Every pattern is tested on at least two wordings: the logs recorded with torch 2.13 (tests/unit/fixtures/logs/)
and the field corpus built around messages copied from torch's, Gloo's and NCCL's sources and public issues
(tests/unit/fixtures/logs/field/). A row with `needs_context` (a bare `Connection reset by peer`, `host not
found`) is named only when a distributed-communication line (c10d, Gloo, NCCL, torchrun, a torch.distributed
frame) stands near it and no download/HTTP client line does: a Hugging Face Hub download reset is not a DDP
failure. A row with `unless_foreign` (a bare `Too many open files`) is named in any log but next to such a line or a
web server's: pasted from a training node, a low open-file limit is the host's cause whatever raised it.
"""

from __future__ import annotations

from ddpfix.diagnose.bounded import then
from ddpfix.diagnose.model import Pattern
from ddpfix.diagnose.patterns_host import HOST_PATTERNS
from ddpfix.model.cluster import DEFAULT_ENV_PATH
from ddpfix.rules import env as env_rules
from ddpfix.rules import fabric as fabric_rules
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import host as host_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import net as net_rules
from ddpfix.rules import netif as netif_rules
from ddpfix.rules import probes as probes_rules
from ddpfix.rules import reachability as reachability_rules
from ddpfix.rules import time as time_rules

_IP = r"\[?([0-9A-Fa-f:.]+|[\w.-]+)\]?"

PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "loopback-advertised",
        "a rank advertised a loopback address to its peers",
        (r"remote=\[(127\.\d+\.\d+\.\d+|::1)\]", r"connect\(\) to (127\.\d+\.\d+\.\d+)",
         r"\((127\.0\.1\.1), \d+\)", r"connect \[(127\.\d+\.\d+\.\d+)\]:(\d+)"),
        "Gloo (with no GLOO_SOCKET_IFNAME) binds the address its hostname resolves to. On Debian/Ubuntu the hostname "
        "is mapped to 127.0.1.1 in /etc/hosts, so peers dial loopback and reach themselves.",
        (hosts_rules.HOSTNAME_LOOPBACK.id, netif_rules.AUTOSELECT_WRONG.id),
        "Map every hostname to its cluster address and set GLOO_SOCKET_IFNAME per node: ddpfix remediate --apply "
        "writes the /etc/hosts block and the env files.",
        example="Gloo connectFullMesh failed with [...pair.cc:144] Connection refused, remote=[127.0.1.1]:17308",
        explains=("gloo-peer-connect", "gloo-collective-timeout"),
    ),
    Pattern(
        "socket-ifname-missing",
        "the socket interface named in NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME does not exist here",
        (r"Unable to find address for: ?(\S+)", r"Bootstrap : no socket interface found",
         r"no NCCL_SOCKET_IFNAME interface found", r"NET/Socket : No usable listening interface",
         r"neither AF_INET\(2\) nor AF_INET6\(10\)", r"Bootstrap: no socket interface found",
         r"NET/Socket : no interface found", r"No usable listening interface found",
         r"No interface found in the same subnet as remote address ([0-9A-Fa-f:.%]{2,64})"),
        "The interface name in the environment matches no interface with an address on this node: names differ "
        "between nodes (eth0 here, ens5 there) or the interface is down or has no address.",
        (netif_rules.MISSING.id, netif_rules.NAME_MISMATCH.id, netif_rules.DOWN.id),
        "Write per-node interface names into the env files: ddpfix env --apply (NCCL: NCCL_SOCKET_IFNAME==<if>, "
        "Gloo: GLOO_SOCKET_IFNAME=<if>).",
        example="NCCL WARN Bootstrap : no socket interface found",
    ),
    Pattern(
        "nccl-virtual-interface",
        "NCCL chose a container bridge, veth, libvirt or link-local interface",
        (r"(?:NET/Socket|Bootstrap) ?: Using \[\d+\]((?:docker|veth|virbr|br-|cni|flannel|cali|vxlan|lxcbr|weave"
         r"|tailscale|wg|tunl|cilium)[\w.-]*):([0-9A-Fa-f:.]+)",
         r"(?:NET/Socket|Bootstrap) ?: Using \[\d+\]([\w.-]+):(169\.254\.\d+\.\d+|fe80:[0-9a-f:]*)",
         r"Bootstrap ?: Using ((?:docker|veth|virbr|br-|cni|flannel|cali|weave|tailscale|wg|tunl)[\w.-]*)"
         r":([0-9A-Fa-f:.]+)"),
        "With no NCCL_SOCKET_IFNAME, NCCL takes the first interface whose name is not docker*/lo* (from 2.28.3 not "
        "virbr* either), in the kernel's order; a bridge, veth, overlay (flannel, Calico, Weave), VPN (Tailscale, "
        "WireGuard) or a link-local address is reachable from no other node on the cluster network, so peers dial "
        "an address that leads nowhere (connect timeouts, hangs at the first collective).",
        (netif_rules.AUTOSELECT_WRONG.id, netif_rules.NAME_MISMATCH.id),
        "Pin the cluster interface in the env files: ddpfix env --apply (NCCL_SOCKET_IFNAME=<if>).",
        example="NCCL INFO NET/Socket : Using [0]veth3f2a1b:172.17.0.1<0>",
    ),
    Pattern(
        "address-in-use",
        "MASTER_PORT is already in use on the master",
        (r"EADDRINUSE", r"[Aa]ddress already in use", r"errno: 98\b"),
        "Another process (an earlier job, a stuck rank, or an outgoing socket when the port lies inside "
        "net.ipv4.ip_local_port_range) holds MASTER_PORT on the master.",
        (probes_rules.PORT_IN_USE.id, net_rules.MASTER_PORT_EPHEMERAL.id),
        "Stop the process holding the port, or choose a ddp_master_port outside the ephemeral range.",
        example="The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).",
        needs_context=True,
    ),
    Pattern(
        "address-family",
        "an IPv4/IPv6 address family the node does not support",
        (r"[Aa]ddress family not supported by protocol", r"errno: 97\b", r"EAFNOSUPPORT"),
        "A socket was opened for a family the node has disabled (IPv6 off, yet [::] or an AAAA record chosen), or "
        "nodes resolve MASTER_ADDR to different families.",
        (hosts_rules.FAMILY_MISMATCH.id, hosts_rules.PEER_MISMATCH.id),
        "Use an IPv4 literal or a name that resolves to the same IPv4 address on every node (ddpfix remediate "
        "--apply writes the hosts block).",
        example="The server socket has failed to bind to [::]:29500 (errno: 97 - Address family not supported by "
                "protocol).",
    ),
    Pattern(
        "master-unreachable",
        "a rank could not connect to MASTER_ADDR:MASTER_PORT (the TCP store)",
        (r"trying to connect to \(([^,]{1,256}), (\d+)\)", r"failed to connect/validate to host ([^:\s]{1,256}):(\d+)",
         r"has failed to connect to any network address (?:of|on) \(\s{0,8}([^,]{1,256}), (\d+)\)",
         r"client socket has failed to connect to \[?([^\]\s]{1,256}?)\]?:(\d+) \(errno: (110|111|113|101|1|13)\b",
         r"connect\(\) timed out\. Original timeout was (\d+) ms",
         r"RendezvousConnectionError: The connection to the C10d store has failed",
         then(r"[Cc]onnection refused", r"(?:TCPStore|MASTER_ADDR)")),
        "The TCP store on the master did not answer: a firewall drops (errno 110, timed out) or rejects (111, "
        "refused; 113, no route to host: firewalld's ICMP reject) MASTER_PORT, this node has no route to "
        "MASTER_ADDR's network (101, network unreachable; also a reject with net-unreachable/net-prohibited), this "
        "node's own firewall drops the outgoing connect (1, operation not permitted; 13, permission denied), "
        "MASTER_ADDR is a public/NAT or wrong address, the route leaves through a gateway, or rank 0 is not "
        "running. torch 2.x retries a refused connect until the timeout, "
        "so a refusal also reads as 'timed out' (torch 1.x: 'connect() timed out').",
        (probes_rules.MASTER_PORT_UNREACHABLE.id, firewall_rules.MASTER_PORT_BLOCKED.id,
         net_rules.MASTER_NOT_PRIVATE.id,
         net_rules.VIA_GATEWAY.id, reachability_rules.UNREACHABLE.id),
        "Open MASTER_PORT to the cluster network and use the master's private address: ddpfix remediate --apply.",
        example="DistNetworkError: The client socket has failed to connect to any network address of (node1, "
                "29400). The client socket has failed to connect to node1:29400 (errno: 110 - Connection timed out).",
    ),
    Pattern(
        "master-address-unusable",
        "this node cannot dial the address MASTER_ADDR resolves to (errno 22 / 99)",
        (r"client socket has failed to connect to \[?([^\]\s]{1,256}?)\]?:(\d+) \(errno: (22|99) ",),
        "The connect failed before any packet left: errno 22 (Invalid argument) is Linux's answer to an IPv6 "
        "link-local address (fe80::) with no interface scope, which a name resolves to through mDNS or a hosts "
        "entry; errno 99 (Cannot assign requested address) means the node has no local address of that family "
        "(IPv6 disabled, an AAAA record chosen) or no free local port. torch does not retry either.",
        (hosts_rules.PEER_MISMATCH.id, hosts_rules.FAMILY_MISMATCH.id, hosts_rules.PEER_UNRESOLVABLE.id),
        "Make MASTER_ADDR an IPv4 cluster address, or a name that resolves to it on every node (ddpfix remediate "
        "--apply writes the hosts block).",
        example="[W socket.cpp:601] [c10d] The client socket has failed to connect to [node1]:29500 (errno: 22 - "
                "Invalid argument).",
        explains=("master-unreachable",),  # its "failed to connect to any network address" summary line
    ),
    Pattern(
        "store-clients-missing",
        "the master's TCPStore waited for clients and not all joined (k/n joined)",
        (r"Timed out after (\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<world>\d+) clients joined",
         r"Timed out initializing process group in store based barrier on rank:? (\d+), for key: ([^\s(]+) "
         r"\(world_size=(?P<world>\d+), (?:worker_count|num_workers_joined)=(?P<joined>\d+)"),
        "Rank 0's store counted k of n ranks (torch <= 1.13: the store based barrier's worker_count / "
        "num_workers_joined of world_size). The missing ones never reached it: their nodes cannot reach "
        "MASTER_ADDR:MASTER_PORT (firewall, route, a non-cluster address), were started with another NNODES / "
        "WORLD_SIZE, point at another master, or crashed before init (read their logs first).",
        (probes_rules.MASTER_PORT_UNREACHABLE.id, firewall_rules.MASTER_PORT_BLOCKED.id, env_rules.INCONSISTENT.id,
         env_rules.MISSING.id,
         reachability_rules.UNREACHABLE.id),
        "Write one set of env files from the inventory (ddpfix env --apply) and audit the path to the master.",
        example="torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 2/4 clients "
                "joined.",
        joined="fewer",
    ),
    Pattern(
        "store-shared",
        "more ranks than world_size joined the store: another job uses the same MASTER_ADDR:MASTER_PORT",
        (r"Timed out initializing process group in store based barrier on rank:? (\d+), for key: ([^\s(]+) "
         r"\(world_size=(?P<world>\d+), (?:worker_count|num_workers_joined)=(?P<joined>\d+)",),
        "The store counted more ranks than this job's world_size: processes of another job (two jobs started with "
        "the same MASTER_PORT on one master node, the default 29500 for both) or leftovers of an earlier run "
        "registered in the same store, so the counts of both jobs mix and neither gets through its barrier. The "
        "ranks are not missing.",
        (probes_rules.PORT_IN_USE.id,),
        "Give every job its own MASTER_PORT (torchrun --master-port / --rdzv-endpoint) and stop leftover ranks on "
        "the master (ss -ltnp 'sport = :PORT' names the holder); ddpfix audit reports a port already taken.",
        example="RuntimeError: Timed out initializing process group in store based barrier on rank: 1, for key: "
                "store_based_barrier_key:1 (world_size=4, worker_count=31, timeout=0:30:00)",
        joined="more",
    ),
    Pattern(
        "store-foreign-reply",
        "MASTER_PORT answered with something that is not this job's TCPStore reply",
        (r"Stop_waiting response is expected",),
        "The TCPStore client got a reply its protocol does not expect: MASTER_ADDR:MASTER_PORT is served by "
        "another program or by another job's store (a port shared by two jobs), or the nodes run different torch "
        "versions whose store protocols differ.",
        (probes_rules.PORT_IN_USE.id, env_rules.TORCH_VERSION_MISMATCH.id),
        "Give the job a MASTER_PORT nothing else uses on the master and one torch version on every node; ddpfix "
        "audit reports a port already taken and torch versions that differ.",
        example="RuntimeError: Stop_waiting response is expected",
    ),
    Pattern(
        "launch-env-missing",
        "a launcher variable (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) is not set in the rank's environment",
        (r"[Ee]nvironment variable (\w+) expected, but not set",),
        "init_process_group's env:// rendezvous reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from the "
        "environment: the script was started without torchrun (which sets them), or the env file was not "
        "exported into the launching shell, unit or container.",
        (env_rules.MISSING.id,),
        "Start the ranks with torchrun, and export the env file ddpfix env --apply writes before launching: "
        f"set -a; . {DEFAULT_ENV_PATH}; set +a (systemd: EnvironmentFile=, docker: --env-file).",
        example="ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable "
                "MASTER_ADDR expected, but not set",
    ),
    Pattern(
        "nccl-unique-id-timeout",
        "ranks waited for rank 0's ncclUniqueId and it never came: rank 0 did not reach NCCL init",
        (r"retrieving ncclUniqueId from \[0\] via c10d key-value store by key '([^']{0,64})', "
         r"but store->get\('[^']{0,64}'\) "
         r"got error: (?:wait timeout|Socket Timeout|[Tt]imed out)",),
        "The store works (the ranks reached it), but rank 0 never published the NCCL id: rank 0 is alive but stuck "
        "or slower (a download, a barrier elsewhere, a collective only some ranks call) or crashed without "
        "closing the store. This is not the network: read rank 0's log.",
        (),
        "Find what rank 0 was doing (py-spy dump on its process); raise init_process_group's timeout only if "
        "rank 0 is just slow.",
        example="DistBackendError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via "
                "c10d key-value store by key '0', but store->get('0') got error: wait timeout after 600000ms",
    ),
    Pattern(
        "nccl-unique-id-closed",
        "the store closed while ranks waited for rank 0's ncclUniqueId: rank 0 (or its launcher) died",
        (r"retrieving ncclUniqueId from \[0\] via c10d key-value store by key '([^']{0,64})', "
         r"but store->get\('[^']{0,64}'\) "
         r"got error: (?:Connection reset by peer|Connection refused|Broken pipe|Failed to recv|"
         r"[^\n]{0,400}?[Cc]onnection was likely closed)",),
        "The connection to the store on rank 0's node was reset or closed: the process hosting the store (rank 0 "
        "or its torchrun agent) exited. Look for rank 0's own error first; only when rank 0 is still running does "
        "the network (a firewall or conntrack dropping an established connection) come in.",
        (reachability_rules.UNREACHABLE.id, probes_rules.MASTER_PORT_UNREACHABLE.id),
        "Read rank 0's log for its first error; if it was alive, audit the path to the master.",
        example="DistBackendError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via "
                "c10d key-value store by key '0', but store->get('0') got error: Connection reset by peer",
    ),
    Pattern(
        "gloo-peer-connect",
        "Gloo could not connect to a peer's ephemeral port",
        (then(r"connectFullMesh failed", r"(?:Connection refused|timed out connecting|Connect timeout|Connection "
                                          r"timed out|Connection reset by peer|No route to host|\] no error)"),
         r"failed to connect, willRetry=0",
         r"gloo/transport/tcp/pair\.cc:\d+\] connect \[([^\]]+)\]:(\d+): (.+)"),
        "After the store rendezvous, every pair of ranks connects directly on random ephemeral ports. A firewall on "
        "the peer (REJECT: 'Connection refused'; DROP: 'Connect timeout'), a route through a gateway, or an "
        "interface picked on the wrong network blocks those connections. '[pair.cc:144] no error' is Gloo's "
        "wording for a peer that closed the connection during the handshake (often the peer's own failure, or a "
        "firewall resetting it).",
        (firewall_rules.PEER_PORTS_BLOCKED.id, probes_rules.PEER_UNREACHABLE.id, net_rules.VIA_GATEWAY.id,
         netif_rules.AUTOSELECT_WRONG.id,
         netif_rules.CANNOT_REACH_PEERS.id),
        "Trust the cluster's private CIDR in every node's firewall (ddpfix remediate --apply) and pin the socket "
        "interface (env files).",
        example="RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect [192.168.0.222]:2226: "
                "Connection refused",
        explains=("gloo-collective-timeout",),  # the other ranks then wait for the peer that never connected
    ),
    Pattern(
        "gloo-collective-timeout",
        "a Gloo collective timed out waiting for a peer: a straggler or a stalled connection, not surely the network",
        (r"Timed out waiting (\d+)ms for (recv|send) operation to complete",),
        "The ranks were connected, then a peer sent nothing for the whole timeout. Most often that peer is slower, "
        "stuck or crashed (read its log first: a rank that reached the collective late or never). Otherwise the "
        "connection stopped carrying packets: an MTU that differs between nodes passes small messages and drops "
        "large ones, and a stateful firewall or NAT on a routed path drops a connection that was idle too long.",
        (netif_rules.MTU_MISMATCH.id, net_rules.VIA_GATEWAY.id),
        "Read the other ranks' logs for the first failure; if all were waiting, ddpfix audit compares the MTUs "
        "and the routes between the nodes.",
        example="RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                "1800000ms for recv operation to complete",
    ),
    Pattern(
        "nccl-socket-connect",
        "NCCL could not connect to a peer's socket port",
        (r"socketStartConnect: Connect to " + _IP + r"<(\d+)> failed : (.+)",
         r"Connect to ([0-9A-Fa-f:.]+)<(\d+)> failed : (.+)",
         r"Call to connect returned (Connection refused|Connection timed out|No route to host), retrying",
         r"socketStartConnect: exceeded (retries|timeouts)"),
        "NCCL's bootstrap and socket transport connect to peers on random ports. Refused: a REJECT rule or nothing "
        "listening; timed out / 'Software caused connection abort': a DROP rule, or an interface chosen on a "
        "network the peer cannot reach (docker0, a second NIC). NCCL logs 'retrying' and keeps trying: the job "
        "hangs, then the watchdog fires.",
        (firewall_rules.PEER_PORTS_BLOCKED.id, probes_rules.PEER_UNREACHABLE.id, netif_rules.AUTOSELECT_WRONG.id,
         net_rules.VIA_GATEWAY.id,
         netif_rules.CANNOT_REACH_PEERS.id),
        "Trust the cluster's private CIDR in every node's firewall and pin NCCL_SOCKET_IFNAME: ddpfix remediate "
        "--apply, ddpfix env --apply.",
        example="misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<44801> failed : Software "
                "caused connection abort",
    ),
    Pattern(
        "connection-reset",
        "a connection between ranks was reset or timed out during the job",
        (r"[Cc]onnection reset by peer", r"[Cc]onnection closed by peer", r"Socket Timeout",
         r"ECONNRESET"),
        "A peer process died (look for the first rank that failed), a firewall or conntrack table dropped an "
        "established connection, or the master's listen backlog overflowed at scale (net.core.somaxconn).",
        (probes_rules.PEER_UNREACHABLE.id, firewall_rules.PEER_PORTS_BLOCKED.id, net_rules.SOMAXCONN_LOW.id,
         reachability_rules.UNREACHABLE.id),
        "Find the first failing rank in the logs; then audit the network between the nodes.",
        example="RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
                "[10.0.0.2]:4193",
        needs_context=True,
        generic=True,
    ),
    Pattern(
        "connect-failed",
        "a connection between nodes was refused, timed out or had no route",
        (r"[Cc]onnection refused|ECONNREFUSED", r"[Nn]o route to host|EHOSTUNREACH|errno: 113\b",
         r"[Cc]onnection timed out|ETIMEDOUT|errno: 110\b"),
        "Refused: nothing listens on that port or a REJECT rule answers; no route to host: firewalld's ICMP reject "
        "or a wrong route; timed out: a DROP rule, a wrong route or a non-cluster address.",
        (firewall_rules.MASTER_PORT_BLOCKED.id, firewall_rules.PEER_PORTS_BLOCKED.id, net_rules.VIA_GATEWAY.id,
         net_rules.MASTER_NOT_PRIVATE.id, probes_rules.PEER_UNREACHABLE.id),
        "Audit the path between the nodes: ddpfix audit; ddpfix remediate --apply opens the cluster network.",
        example="RuntimeError: Connection refused",
        needs_context=True,
        generic=True,
    ),
    Pattern(
        "nccl-system-error",
        "NCCL failed on a system or library call (ncclSystemError)",
        (r"unhandled system error", r"ncclSystemError"),
        "NCCL's generic code for a failed system call (socket, malloc, shm, ibverbs): the log does not say which. "
        "On a host the usual causes are a low open-file limit (sockets), a small /dev/shm, a low memlock limit "
        "(RDMA) and a socket interface that does not exist or is wrong. Before NCCL 2.12 a peer that exited also "
        "read as a system error.",
        (host_rules.NOFILE_LOW.id, host_rules.SHM_SMALL.id, fabric_rules.MEMLOCK_LOW.id, netif_rules.MISSING.id,
         netif_rules.AUTOSELECT_WRONG.id),
        "Re-run with NCCL_DEBUG=INFO: the first 'NCCL WARN' line (and torch's 'Last error:') names the call that "
        "failed; ddpfix audit checks the limits, /dev/shm and the interfaces.",
        example="RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled "
                "system error, NCCL version 2.14.3",
        generic=True,
    ),
    Pattern(
        "nccl-remote-error",
        "NCCL lost a peer: the remote process exited or the network between the nodes failed (ncclRemoteError)",
        (r"remote process exited or there was a network error", r"ncclRemoteError"),
        "A connection to another rank broke. Most often that rank died first (an exception, the OOM killer, a "
        "node that went away): its own log has the real error. Otherwise the network between the nodes: a "
        "firewall dropping the connection, an MTU that differs, a route through a gateway.",
        (firewall_rules.PEER_PORTS_BLOCKED.id, netif_rules.MTU_MISMATCH.id, net_rules.VIA_GATEWAY.id,
         probes_rules.PEER_UNREACHABLE.id),
        "Read the other ranks' logs for the first failure; if every rank was alive, ddpfix audit checks the "
        "firewall, the MTUs and the routes between the nodes.",
        example="torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.19.3",
        explains=("connection-reset",),
        generic=True,
    ),
    Pattern(
        "rendezvous-timeout",
        "not every node joined the rendezvous in time",
        (r"RendezvousTimeoutError", r"[Rr]endezvous (?:timed out|timeout)"),
        "The c10d/etcd rendezvous waited for --nnodes nodes and fewer joined: a node could not reach the rendezvous "
        "endpoint, resolved its name differently, was started with other --nnodes/--rdzv-id values, or its clock "
        "is off (elastic heartbeats compare wall clocks).",
        (reachability_rules.UNREACHABLE.id, probes_rules.MASTER_PORT_UNREACHABLE.id, hosts_rules.PEER_UNRESOLVABLE.id,
         hosts_rules.PEER_MISMATCH.id,
         env_rules.INCONSISTENT.id, time_rules.SKEW.id),
        "Start every node with the same values from the ddpfix env files (ddpfix env --apply) and audit the nodes.",
        example="torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
    ),
    Pattern(
        "ranks-missing",
        "some ranks never joined the process group (WORLD_SIZE or ranks disagree between nodes)",
        (r"DistStoreError: wait timeout after \d+ms, keys: /default_pg", then(r"[Ww]orld size ", r" does not match"),
         r"rank \d+ (?:is )?(?:out of range|>= world_size)", r"Invalid rank (\d+)"),
        "init_process_group waits until WORLD_SIZE ranks have registered in the store. A node started with another "
        "WORLD_SIZE/RANK (hand-edited env files, a node missing from the list) leaves the others waiting.",
        (env_rules.INCONSISTENT.id, env_rules.MISSING.id, reachability_rules.UNREACHABLE.id),
        "Write consistent env files on every node: ddpfix env --apply (ranks and world size from one inventory).",
        example="torch.distributed.DistStoreError: wait timeout after 30000ms, keys: /default_pg/0//cuda//0",
    ),
    *HOST_PATTERNS,
    Pattern(
        "collective-timeout-first",
        "the first collective timed out: the ranks never connected (connectivity, not a hang)",
        (r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=1,",
         r"(?:Timeout at NCCL work|detected by watchdog at work): \d+, last enqueued NCCL work: \d+, "
         r"last completed NCCL work: -1\b"),
        "The watchdog fired on the very first collective (SeqNum=1 / no work ever completed): the communicator "
        "never came up between some pair of ranks. That is the network: a peer port blocked, a wrong interface "
        "(docker0, a second NIC), an RDMA GID mismatch.",
        (firewall_rules.PEER_PORTS_BLOCKED.id, probes_rules.PEER_UNREACHABLE.id, netif_rules.AUTOSELECT_WRONG.id,
         fabric_rules.GID_INDEX_DIFFERS.id),
        "Rerun with NCCL_DEBUG=INFO to see the transport each rank picked; ddpfix audit checks the peer ports, the "
        "interfaces and the fabric.",
        example="[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
                "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.",
        explains=("collective-timeout-later",),
    ),
    Pattern(
        "collective-timeout-later",
        "a later collective timed out: a hang or a straggler, not the network",
        (r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+)",
         r"(?:Timeout at NCCL work|detected by watchdog at work): (\d+), last enqueued NCCL work: \d+, "
         r"last completed NCCL work: \d+"),
        "Collectives had completed before (SeqNum > 1), so the ranks were connected. One rank did not enter the "
        "collective in time: it hung (a deadlock, data loading, a checkpoint write), crashed, or called collectives "
        "in another order or size. The host checks will not find this.",
        (),
        "Find the rank whose 'last enqueued' lags (TORCH_NCCL_DUMP_ON_TIMEOUT=1, the flight recorder, py-spy dump); "
        "check the code path around that step.",
        example="[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64214, OpType=ALLGATHER, "
                "NumelIn=1, NumelOut=32, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
    ),
    Pattern(
        "unresolvable-name",
        "a node name did not resolve",
        (r"network addresses of \(([^,]{1,256}), (\d+)\) cannot be retrieved", r"Name or service not known",
         r"[Tt]emporary failure in name resolution", r"host not found", then(r"getaddrinfo", r"failed")),
        "A peer or MASTER_ADDR name resolves on some nodes but not on others.",
        (hosts_rules.PEER_UNRESOLVABLE.id, hosts_rules.PEER_MISMATCH.id),
        "Use the same managed /etc/hosts block on every node (ddpfix remediate --apply) or IP literals.",
        example="The IPv4 network addresses of (node9, 29500) cannot be retrieved (gai error: -2 - Name or service "
                "not known).",
        needs_context=True,
    ),
    # verify's own launch output (not from a user's log)
    Pattern(
        "torch-missing",
        "ddp_python on this node cannot run torch",
        (r"failed to run command", r"No module named .?torch\b"),
        "The interpreter verify launched has no torch.",
        (),
        "Set ddp_python to an interpreter with torch installed.",
        example="ModuleNotFoundError: No module named 'torch'",
        scope="verify",
    ),
    Pattern(
        "interface-no-such-device",
        "the socket interface verify bound to does not exist on this node",
        (r"[Nn]o such device",),
        "A bind to the interface in the env file failed: the name does not exist on this node.",
        (netif_rules.MISSING.id,),
        "Write per-node interface names into the env files: ddpfix env --apply.",
        example="SO_BINDTODEVICE: No such device",
        scope="verify",
    ),
    Pattern(
        "env-file-missing",
        "the node has no ddpfix env file",
        (then(r"No such file or directory", r"ddp\.env"), r"ddp\.env: No such file"),
        "verify sources the env file that ddpfix env writes.",
        (env_rules.MISSING.id,),
        "Run ddpfix env --apply.",
        example=f"{DEFAULT_ENV_PATH}: No such file or directory",
        scope="verify",
    ),
)


#: read from the whole log (`diagnose.hosts`), not from one line: the versions the nodes report differ
VERSIONS_DIFFER = Pattern(
    "versions-differ",
    "the nodes report different torch, NCCL or NCCL net plugin versions",
    (),
    "Ranks built against different NCCL versions, or with a net plugin (IB, aws-ofi-nccl, a vendor plugin) on "
    "some nodes and not on others, pick different transports or wire protocols: init fails or hangs, or a "
    "collective never completes. torch versions that differ change the store's protocol too.",
    (env_rules.TORCH_VERSION_MISMATCH.id, fabric_rules.NCCL_VERSION_MISMATCH.id),
    "Install one torch build (with its NCCL) and the same net plugin on every node; ddpfix audit compares the "
    "versions across nodes.",
    example="node1:11:11 [0] NCCL INFO NCCL version 2.18.1+cuda12.1 ... node2:12:12 [0] NCCL INFO NCCL version "
            "2.21.5+cuda12.4",
)
