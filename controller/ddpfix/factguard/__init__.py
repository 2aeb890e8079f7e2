"""The trust boundary: every value a node returned is checked like an inventory value before any use.

A node's facts are hostile input (a compromised node, a user with write access to /etc or /sys there): a string it
returns may carry template syntax, shell metacharacters, line breaks or terminal escapes, and would then travel into
peers' files, the env files, the plan a play reads and the operator's terminal. `validate_facts` lists every value
that is not of its field's grammar, as (field, value, why), the audit's invalid-fact findings
(``rules.reachability.INVALID``); `sanitize_facts` returns the copy the checks and the plan read, with each such
value removed. Only well-formed values survive:

- names: hostnames and FQDNs (RFC 1123), interface names (the kernel's alphabet), RDMA device and driver names;
- numbers: ports, indexes, NUMA nodes, states (no bool posing as int);
- fixed formats: IP addresses, CIDRs, MACs, GIDs, P_Keys, digests, NCCL versions, uverbs/umad device names;
- short words read from sysfs (port states, link layers, rates, GID types);
- env-file keys (shell names) and values without control characters.

Free text (error messages, tool output, /etc/hosts lines) is never written anywhere: it is kept as one printable
line (`one_line`: control characters, line separators and undecodable bytes escaped, length cut), so a report,
a terminal or a JUnit file never shows a forged line. Firewall rule text stays as read (it is parsed line by line).
Everything ddpfix hands a play is data, never a template (`ansible.rundirs.as_data`). Pure functions, no hosts needed.

Modules: `grammar` (the grammars, `one_line`, the checker), `sections` (the structured sections), `reach` (a
probe's reach), `facts` (a node's facts as a whole).
"""
