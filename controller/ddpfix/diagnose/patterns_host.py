"""explain's failure table, part two: the host's limits and the RDMA fabric (open files, /dev/shm, locked memory,
InfiniBand/RoCE/EFA). ``diagnose.patterns.PATTERNS`` holds them between the connection failures and the later
collective timeouts, in that order (a diagnosis lists its patterns in table order)."""

from __future__ import annotations

from ddpfix.diagnose.bounded import then
from ddpfix.diagnose.model import Pattern
from ddpfix.rules import fabric as fabric_rules
from ddpfix.rules import host as host_rules

HOST_PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "open-files-exhausted",
        "a rank ran out of file descriptors: the open-file limit (nofile) is too low",
        (r"[Tt]oo many open files", r"\bEMFILE\b", r"errno: 24\b"),
        "Every socket, shared-memory segment and DataLoader worker handle takes a descriptor; NCCL alone opens "
        "several sockets per peer and channel, so a soft nofile limit of 1024 (the default for services, "
        "containers and many login sessions) runs out at scale or in the first alltoall. ('Too many open files in "
        "system' is the kernel-wide fs.file-max instead.)",
        (host_rules.NOFILE_LOW.id,),
        "Raise the soft nofile limit on the launch path: ddpfix remediate --apply (limits.d and the launcher "
        "units); containers: --ulimit nofile=1048576:1048576. A DataLoader can also use "
        "torch.multiprocessing.set_sharing_strategy('file_system').",
        example="misc/socket.cc:434 NCCL WARN Net : Socket creation failed : Too many open files",
        unless_foreign=True,
    ),
    Pattern(
        "shm-exhausted",
        "/dev/shm is too small: NCCL's SHM transport or a DataLoader worker could not extend its segment",
        (r"failed to extend (/dev/shm/[\w.-]+) to (\d+) bytes",
         r"Error while creating shared memory segment (/dev/shm/[\w.-]+)",
         r"bus error encountered in worker\. This might be caused by insufficient shared memory"),
        "Not the network. NCCL's shared-memory transport (ranks on one node that cannot use P2P) and DataLoader "
        "workers put their buffers in /dev/shm; a container's default 64 MiB (Docker without --shm-size or --ipc=host, "
        "a Kubernetes pod without a Memory emptyDir) runs out at the first large step.",
        (host_rules.SHM_SMALL.id,),
        "Give the node a larger /dev/shm: --ipc=host or --shm-size (containers), an emptyDir with medium: Memory "
        "(Kubernetes), mount -o remount,size= (hosts); ddpfix audit reports the size each node needs.",
        example="misc/shmutils.cc:38 NCCL WARN Error: failed to extend /dev/shm/nccl-IjJ0gS to 9637892 bytes",
    ),
    Pattern(
        "rdma-memlock",
        "RDMA memory could not be pinned: the memlock limit is too low",
        (r"Call to ibv_create_cq failed with error Cannot allocate memory",
         then(r"ibv_create_cq", r"Cannot allocate memory"),
         then(r"ibv_reg_mr\w{0,16} failed", r"Cannot allocate memory"), r"NET/IB : Unable to register memory"),
        "ibverbs pins queues and buffers in RAM; a memlock limit of 64 KB (the default for services and many "
        "containers) makes ibv_create_cq / ibv_reg_mr fail with ENOMEM.",
        (fabric_rules.MEMLOCK_LOW.id,),
        "Lift the memlock limit (ddpfix remediate --apply; containers: --ulimit memlock=-1).",
        example="misc/ibvwrap.cc:203 NCCL WARN Call to ibv_create_cq failed with error Cannot allocate memory",
        explains=("nccl-ib",),
    ),
    Pattern(
        "nccl-ib",
        "an InfiniBand/RoCE transport error in NCCL",
        (then(r"NET/IB ?: ", r"(?:completion|error)"), r"NCCL WARN NET/IB", r"ibv_\w{1,40} failed",
         r"Got completion from peer (\S+) with (?:status=|error )(\d+)"),
        "NCCL's IB transport failed: on RoCE most often a GID index that differs between nodes (completion error "
        "12, retry exceeded), a P_Key mismatch, or a port that is down.",
        (fabric_rules.GID_INDEX_DIFFERS.id, fabric_rules.ROCE_NO_V2_GID.id, fabric_rules.PKEY_MISMATCH.id,
         fabric_rules.PORT_DOWN.id,
         fabric_rules.MEMLOCK_LOW.id, fabric_rules.LINK_LAYER_MIXED.id, fabric_rules.NO_UVERBS.id),
        "Run ddpfix audit: it compares GID indexes, P_Keys, link layers and port states across nodes and checks the "
        "memlock limit; ddpfix env --apply writes NCCL_IB_GID_INDEX only when one RoCE v2 index is common to all "
        "nodes, and remediate --apply lifts the memlock limit.",
        example="NCCL WARN NET/IB : Got completion from peer 10.0.0.2<50311> with status=12 opcode=0 len=0 vendor "
                "err 129 (Recv)",
    ),
    Pattern(
        "nccl-ib-fallback",
        "NCCL found no InfiniBand/RoCE device and fell back to TCP sockets",
        (r"NET/IB : No device found",),
        "NCCL found no usable RDMA device (no /dev/infiniband in the container, no rdma-core, NCCL_IB_HCA naming "
        "nothing) and moved the traffic to TCP sockets: several times slower on an RDMA cluster. On an "
        "Ethernet-only cluster this line is expected.",
        (fabric_rules.NO_UVERBS.id, fabric_rules.PORT_DOWN.id, fabric_rules.HCA_INCLUDES_MGMT.id),
        "Give the job the RDMA devices (containers: --device /dev/infiniband, rdma-core) and check the ports: "
        "ddpfix audit.",
        example="NCCL INFO NET/IB : No device found.",
        also=r"NET/Socket : Using|Using network Socket",
    ),
    Pattern(
        "efa-provider",
        "the AWS EFA libfabric provider did not initialise (aws-ofi-nccl)",
        (then(r"NET/OFI ", r"(?:fi_getinfo\(\) call failed|[Uu]nable to find a protocol|[Ff]ailed to initialize|"
         r"[Cc]ouldn't find any optimal provider)"),
         r"aws-ofi-nccl initialization failed"),
        "aws-ofi-nccl found no EFA provider: the EFA driver or libfabric is missing in the image, the instance or "
        "security group has no EFA, or FI_PROVIDER names another provider. NCCL then uses TCP or fails.",
        (fabric_rules.EFA_PROVIDER_MISSING.id,),
        "Install the EFA software in the image and allow all traffic within the security group; ddpfix audit checks "
        "the provider.",
        example="NCCL INFO NET/OFI OFI fi_getinfo() call failed: No data available",
    ),
)
