"""The shape of what the node modules return: `ddpfix_node_facts` (as `ansible_facts.ddpfix_node`, also run in-process
by `ddpfix check --local`) and `ddpfix_probe` (its check run). Written from the modules (plugins/modules/ and the
module_utils they use: `ddpfix_nodeinfo`, `ddpfix_envfile`, `ddpfix_firewall`, `ddpfix_fabric`), which stay
stdlib-only Python for the nodes; the controller's checks, plan and verify read the facts through these types.

Values from nodes are validated before anything is written from them (`factguard.facts.validate_facts`): the types
say what a well-behaved node returns, not what the controller may assume unchecked. Keys are only ever added
(`schema: 1`). The module's result is `schema: 2`, the same facts but for `hosts_file`, which travels packed as
`hosts_lines` (one string); the controller's one conversion (`audit.host_facts`) reads it back into `hosts_file`,
so what the checks read stays schema 1's.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired[...] from evaluated annotations.
from typing import Any, Literal, NotRequired, TypedDict


class Address(TypedDict):
    family: Literal["inet", "inet6"]
    local: str
    prefixlen: int


class Interface(TypedDict):
    """One interface of `ip -j -d addr show` (`ddpfix_nodeinfo.interface_facts`)."""

    name: str
    index: int | None
    flags: list[str]
    operstate: str | None
    mtu: int | None
    kind: str | None  # linkinfo.info_kind (bridge, bond, vlan, veth, ...) or the link type (ether, loopback, ...)
    # not from facts modules older than --pin-ifnames (remediate.pin_target says so)
    mac: NotRequired[str | None]  # None unless an Ethernet link
    permaddr: NotRequired[str | None]  # the burned-in MAC of a physical NIC, else None
    physical: NotRequired[bool]  # a bus device and no virtual kind
    addrs: list[Address]


class ClusterInterface(TypedDict):
    """The node's own choice of its cluster NIC (`ddpfix_nodeinfo.cluster_interface`)."""

    cidr: str | None  # ddp_cluster_cidr, else the on-link prefix holding the master's address
    ifname: str | None
    address: str | None
    source: Literal["override", "cidr"] | None  # ddp_socket_ifname, or the first NIC with an address in cidr


class HostsEntry(TypedDict):
    """One /etc/hosts line (`ddpfix_nodeinfo.parse_hosts_file`; comments and blanks dropped)."""

    line: int
    addr: str
    names: list[str]
    text: str


class Sysctl(TypedDict):
    ip_local_port_range: list[int]  # [low, high]
    somaxconn: int
    ipv6_disabled: bool
    # net.ipv4.conf.{all,default,IFACE}.rp_filter by conf name (0 off, 1 strict, 2 loose); not from older modules
    rp_filter: NotRequired[dict[str, int]]
    # net.ipv4.conf.{all,IFACE}.{arp_ignore,arp_announce} by conf name (ddpfix_hostenv.arp_sysctls)
    arp: NotRequired[dict[str, dict[str, int]]]


class ChronyTracking(TypedDict, total=False):
    """`chronyc -c -n tracking` (`ddpfix_nodeinfo.parse_chronyc_tracking`); numbers stay strings when unparsable."""

    ref_id: str
    ref_name: str
    stratum: int | str
    ref_time: float | str
    system_offset: float | str
    last_offset: float | str
    rms_offset: float | str
    frequency_ppm: float | str
    residual_freq_ppm: float | str
    skew_ppm: float | str
    root_delay: float | str
    root_dispersion: float | str
    update_interval: float | str
    leap_status: str
    synchronised: bool  # the node's judgement: leap status is not "Not synchronised" and there is a reference


class TimeFacts(TypedDict):
    daemons: list[str]  # running time-sync daemons: chronyd, ntpd, systemd-timesyncd, ptp4l, ...
    chrony_tracking: ChronyTracking | None


class EnvSecrets(TypedDict):
    """HMAC-SHA256 (hex) of each secret-looking value of `values` and `managed`, keyed with a random `salt`."""

    salt: str
    values: dict[str, str]
    managed: dict[str, str]


class EnvFile(TypedDict):
    """The env file as the audit needs it, secret values redacted (`ddpfix_readers.env_file_facts`)."""

    path: str
    target: str | None  # the symlink's target, None when the path is not a symlink
    exists: bool
    readable: bool
    error: str | None
    values: dict[str, str]  # every key as `set -a; . FILE` leaves it
    owner: Literal["block", "header", "empty", "foreign"] | None
    managed: dict[str, str]  # the keys of ddpfix's managed block
    outside_keys: list[str]  # keys assigned outside the block
    secrets: NotRequired[EnvSecrets]  # HMACs of the redacted (secret-looking) values (older facts: none)


class ProbeConnect(TypedDict, total=False):
    name: str
    address: str
    port: int
    kind: Literal["master", "peer"]
    ok: bool
    error: str | None
    seconds: float
    attempts: int  # a refused dial is retried until the peer's listener is up (or the deadline)
    first_try: float | None
    last_try: float | None  # the start of the last attempt (node clock)


class ProbeListener(TypedDict, total=False):
    """The probe as the facts module ran it in its one task: this node's listener, and (inline, or folded in by the
    second task when the prober ran detached) the prober's result and the resolution and route deviations."""

    address: str | None
    port: int | None
    master_port_listening: bool
    pid: int | None  # a detached prober's PID (else None)
    start: str | None  # a detached prober's start time (/proc/PID/stat field 22)
    result_path: str | None  # where a detached prober writes its result
    mode: Literal["inline", "detached"]
    error: str | None
    connects: list[ProbeConnect]
    #: the interface reach probe: {ifname: {address, speed, device, reached: [peer], failed: {peer: why}}}, only on
    #: a node with more than one candidate interface (raw: the checks read `Context.reach`, validated)
    reach: dict[str, dict[str, Any]]
    inbound: dict[str, int]  # accepted connects by listener kind (peer, master)
    expected_inbound: dict[str, int]
    up_at: float  # the node's clock when its listener was up, and when it closed
    down_at: float
    resolve: dict[str, list[str]]  # deviations only: names that do not resolve first to the expected address
    routes: dict[str, dict[str, Any]]  # deviations only: via a gateway, another interface, or no route
    checked: int  # names looked at (those not in `resolve` resolved as expected)


class Unread(TypedDict):
    """A fact source that could not be read: a check that needs it is not evaluated, never a pass."""

    source: str
    reason: str


class FirewallState(TypedDict, total=False):
    """The live firewall state, `ddpfix.firewall/v1` (the ddpfix_firewall module_utils' docstring has each layer)."""

    schema: str
    firewalld: dict[str, Any] | None
    iptables: str | None
    iptables_legacy: str | None
    ip6tables: str | None
    nft: dict[str, Any] | None
    nft_text: str | None
    errors: list[str]
    unread: list[Unread]


class NodeFacts(TypedDict, total=False):
    """`ansible_facts.ddpfix_node`: everything the audit reads on one node, in one task."""

    schema: int
    hostname: str | None  # None: the node returned an invalid one (factguard.facts.sanitize_facts)
    fqdn: str | None
    machine_id: str
    interfaces: list[Interface]
    cluster: ClusterInterface
    master_ip: str | None  # None: the master's name does not resolve on the node
    resolve_self: dict[str, list[str]]  # hostname and FQDN -> getaddrinfo's addresses, in order
    # with a probe, only the lines the audit uses (the node's own names, names that resolved other than expected,
    # the addresses it dials): hosts_file_scope "relevant"; without one the whole file ("whole")
    hosts_file: list[HostsEntry]
    hosts_file_scope: Literal["relevant", "whole"]
    hosts_file_is_mountpoint: bool
    hosts_block_sha256: str | None  # SHA-256 (hex) of ddpfix's managed block in /etc/hosts; None: no block
    sysctl: Sysctl
    listening: list[int]  # local TCP ports in LISTEN state
    time: TimeFacts
    firewall: FirewallState
    env_file: EnvFile
    fabric: dict[str, Any]  # RDMA devices, GPUs, EFA, NCCL version, memlock (the ddpfix_fabric module_utils)
    limits: dict[str, Any]  # {nofile: {soft, hard, source}, nofile_units: {unit: {...}}} (-1: unlimited)
    torch: dict[str, Any] | None  # {python, version, cuda, hip, nccl, cached, absent} of ddp_python; None: not asked
    shm: dict[str, Any]  # /dev/shm size, free bytes, mount, GPUs seen (ddpfix_launchenv.shm_facts)
    shell_env: dict[str, Any]  # launcher variables set in shell start files (ddpfix_launchenv.stray_env_facts)
    probe: ProbeListener
    now: float  # the node's clock when it read it (time.time())
    now_elapsed: float  # seconds from the module's start to that reading
    errors: list[str]
    unread: list[Unread]


class ProbeResult(TypedDict, total=False):
    """What the checks read of a probe (inside the facts' `probe`): names resolved, routes to the peers, TCP
    connects to the master port and ring peers."""

    resolve: dict[str, list[str]]
    checked: int  # names the node resolved (it returns only those that deviate from the expected address)
    routes: dict[str, dict[str, Any]]
    connects: list[ProbeConnect]
