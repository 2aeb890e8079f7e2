"""ddpfix firewall logic shared by the role's modules, free of Ansible so unit tests can import it.

ddpfix adds exactly one kind of rule: accept from the cluster CIDR, tagged with COMMENT. Everything here finds,
renders or removes that rule and nothing else: persisted files get only ddpfix's own line(s) added (never a dump of
the live ruleset). A runtime rule carries its run's tag (`run_tag`: COMMENT, a colon, the run's id), and a revert
deletes only rules carrying its own run's tag: rules confirmed by earlier runs (runtime, or loaded from the persisted
files, which carry COMMENT alone) stay.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import fnmatch
import ipaddress
import re
import shlex

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_block import BEGIN, END

COMMENT = "ddpfix-cluster"
SKIP_NFT_TABLES = {("inet", "firewalld"), ("ip", "firewalld"), ("ip6", "firewalld")}
#: A run id as it goes into a rule's comment (nft and iptables both take it unescaped; comments stay short).
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")


# --------------------------------------------------------------------------- which run added a rule

def run_tag(run_id):
    """The comment of the runtime rules run `run_id` adds: `ddpfix-cluster:<run_id>`. ValueError for an id that a
    rule comment cannot carry as it is."""
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        raise ValueError(f"ddpfix_firewall_run_id must be 1-40 letters, digits, '.', '_' or '-' (starting with a "
                         f"letter or digit), got {run_id!r}")
    return f"{COMMENT}:{run_id}"


def is_ddpfix_comment(comment):
    """A comment ddpfix's rules carry: COMMENT (persisted, loaded at boot) or a run's tag."""
    return isinstance(comment, str) and (comment == COMMENT or comment.startswith(COMMENT + ":"))


# --------------------------------------------------------------------------- iptables

def rule_argument_spec(**extra):
    """The options every firewall-rule module shares (backend, cidr, comment), plus its own."""
    spec = dict(
        backend=dict(type="str", required=True, choices=["iptables", "nftables"]),
        cidr=dict(type="str", required=True),
        comment=dict(type="str", default=COMMENT),
    )
    spec.update(extra)
    return spec


def iptables_bins(variant):
    """(iptables, iptables-save, iptables-restore) for variant legacy | nft | auto (the distribution default)."""
    if variant in ("legacy", "nft"):
        return (f"iptables-{variant}", f"iptables-{variant}-save", f"iptables-{variant}-restore")
    return ("iptables", "iptables-save", "iptables-restore")


def iptables_rule(cidr, comment=COMMENT):
    """The rule ddpfix adds, as iptables arguments after the chain name."""
    return ["-s", cidr, "-m", "comment", "--comment", comment, "-j", "ACCEPT"]


def iptables_line(cidr, comment=COMMENT):
    return "-A INPUT " + " ".join(iptables_rule(cidr, comment))


def _filter_section(lines):
    """(start, end) indexes of the `*filter` table: the `*filter` line and its COMMIT line; None if absent."""
    start = None
    for i, ln in enumerate(lines):
        s = ln.strip()
        if start is None and s == "*filter":
            start = i
        elif start is not None and s == "COMMIT":
            return start, i
    return None


def _iptables_input_rules(save_text, chain="INPUT"):
    """Every INPUT (`chain`) rule of the filter table: (argument list after the chain, its comment or None)."""
    lines = save_text.splitlines()
    sec = _filter_section(lines)
    out = []
    if sec is None:
        return out
    for ln in lines[sec[0]:sec[1]]:
        if not ln.startswith(f"-A {chain} "):
            continue
        try:
            args = shlex.split(ln)[2:]
        except ValueError:
            continue
        comment = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--comment"), None)
        out.append((args, comment))
    return out


def iptables_tagged(save_text, comment=COMMENT, chain="INPUT"):
    """Every INPUT (`chain`) rule of the filter table tagged with `comment`, as `-D` argument lists (after the
    chain)."""
    return [args for args, c in _iptables_input_rules(save_text, chain) if c == comment]


def _iptables_shape(args):
    """A rule's arguments with its comment blanked and its `-s` network normalised (for comparing rules)."""
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a == "--comment":
            out[i + 1] = ""
        elif a == "-s":
            with contextlib.suppress(ValueError):
                out[i + 1] = str(ipaddress.ip_network(out[i + 1], strict=False))
    return out


def iptables_has_rule(save_text, cidr):
    """Whether the filter table's INPUT chain has ddpfix's accept from `cidr`, whichever run added it."""
    want = _iptables_shape(iptables_rule(cidr))
    return any(is_ddpfix_comment(c) and _iptables_shape(args) == want for args, c in _iptables_input_rules(save_text))


def iptables_blocks(save_text):
    """Whether the filter table's INPUT chain can drop: policy DROP or a DROP/REJECT rule of its own."""
    lines = save_text.splitlines()
    sec = _filter_section(lines)
    if sec is None:
        return False
    for ln in lines[sec[0]:sec[1]]:
        if ln.startswith(":INPUT DROP") or (ln.startswith("-A INPUT ") and re.search(r"-j (DROP|REJECT)\b", ln)):
            return True
    return False


def iptables_persisted(text, cidr, comment=COMMENT, line=None):
    """The rules file text with ddpfix's line (`line`: another of ddpfix's lines, e.g. `iptables_egress_line`) at
    the top of the filter table's INPUT (its own chain's) rules.

    Returns (new_text, reason): new_text is None when the file needs no change (reason "") or cannot take the rule
    (reason says why: no `*filter` section, whose restore would replace the live filter table)."""
    lines = text.splitlines()
    sec = _filter_section(lines)
    if sec is None:
        return None, "has no *filter table section"
    start, end = sec
    want = line or iptables_line(cidr, comment)
    for ln in lines[start:end]:
        if ln.strip() == want:
            return None, ""
    at = start + 1
    while at < end and (lines[at].startswith(":") or lines[at].startswith("#") or not lines[at].strip()):
        at += 1
    new = [*lines[:at], want, *lines[at:]]
    return "\n".join(new) + "\n", ""


# --------------------------------------------------------------------------- egress (the node's own connects)
# The controller's plan (ddpfix.firewall.egressfix) names the chains that refuse the node's connects to its peers and
# the ports; ddpfix adds one accept per chain: TCP to the cluster CIDR on those ports, at the top of the chain.

_PORTS = re.compile(r"[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?){0,6}")


def egress_ports(spec):
    """'29500,32768-60999' -> [(29500, 29500), (32768, 60999)]: at most 7 ports or ranges (iptables multiport's
    limit is 15 ports, a range counting two), each 1-65535. ValueError naming what is wrong."""
    if not isinstance(spec, str) or not _PORTS.fullmatch(spec):
        raise ValueError(f"egress ports must be 'PORT[-PORT],...' (at most 7), got {spec!r}")
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if not 1 <= a <= b <= 65535:
            raise ValueError(f"egress port range {part!r} is not within 1-65535")
        out.append((a, b))
    return out


#: An nft table or chain name the controller may pass (the controller's plan checks the same grammar).
# nft's own identifier grammar (its scanner: a letter, `_` or `.`, then letters, digits, `_.-`; `/` left out): never
# a word nft could read as an option (`-f FILE`, `-c`) where the name goes on its command line
NFT_NAME = re.compile(r"[A-Za-z_.][A-Za-z0-9_.-]{0,63}")
#: Input base chains one node's ingress plan may name.
MAX_NFT_CHAINS = 8


def nft_chains_checked(chains):
    """The input base chains the controller planned for ddpfix's ingress accept ([{family, table, chain}], the audit's
    evaluator chose them), checked: -> [(family, table, chain)]. ValueError naming what is wrong."""
    if not isinstance(chains, list) or len(chains) > MAX_NFT_CHAINS:
        raise ValueError(f"nft_chains must be a list of at most {MAX_NFT_CHAINS} chains, got {chains!r}")
    out = []
    for c in chains:
        if not isinstance(c, dict) or set(c) != {"family", "table", "chain"}:
            raise ValueError(f"an nft chain must be {{family, table, chain}}, got {c!r}")
        fam, table, chain = (str(c[k]) for k in ("family", "table", "chain"))
        if fam not in ("ip", "inet") or not NFT_NAME.fullmatch(table) or not NFT_NAME.fullmatch(chain):
            raise ValueError(f"an nft chain needs family ip|inet and plain table/chain names, got {c!r}")
        if (fam, table) in SKIP_NFT_TABLES:
            raise ValueError(f"firewalld's table {fam} {table} is changed through firewalld, not nft")
        out.append((fam, table, chain))
    return list(dict.fromkeys(out))


def nft_chain_keys(ruleset):
    """(family, table, name) of every chain of the rule set."""
    chains = [it.get("chain") for it in _items(ruleset) if isinstance(it, dict)]
    return {(c.get("family"), c.get("table"), c.get("name")) for c in chains if isinstance(c, dict)}


def nft_input_chains(ruleset):
    """(family, table, name) of every base chain on the input hook of the rule set."""
    chains = [it.get("chain") for it in _items(ruleset) if isinstance(it, dict)]
    return {(c.get("family"), c.get("table"), c.get("name")) for c in chains
            if isinstance(c, dict) and c.get("hook") == "input"}


def egress_change(change, cidr):
    """One planned egress change, checked: {backend: nftables|iptables|iptables-legacy, family, table, chain,
    ports}. -> (backend, family, table, chain, [(lo, hi)]). ValueError naming what is wrong."""
    if not isinstance(change, dict):
        raise ValueError(f"an egress change must be a dict, got {change!r}")
    backend = change.get("backend")
    ipaddress.ip_network(cidr, strict=False)
    ports = egress_ports(change.get("ports"))
    if backend == "nftables":
        fam, table, chain = (str(change.get(k) or "") for k in ("family", "table", "chain"))
        if fam not in ("ip", "inet") or not NFT_NAME.fullmatch(table) or not NFT_NAME.fullmatch(chain):
            raise ValueError(f"nftables egress change needs family ip|inet and plain table/chain names, got {change!r}")
        if (fam, table) in SKIP_NFT_TABLES:
            raise ValueError(f"firewalld's table {fam} {table} is changed through firewalld, not nft")
        return backend, fam, table, chain, ports
    if backend in ("iptables", "iptables-legacy") and change.get("chain") == "OUTPUT":
        return backend, "", "filter", "OUTPUT", ports
    raise ValueError(f"egress changes go to an nftables chain or iptables OUTPUT, got {change!r}")


def iptables_egress_rule(cidr, ports, comment=COMMENT):
    """The egress accept, as iptables arguments after `OUTPUT` (as iptables-save prints them)."""
    spec = ",".join(str(a) if a == b else f"{a}:{b}" for a, b in ports)
    return ["-d", cidr, "-p", "tcp", "-m", "multiport", "--dports", spec, "-m", "comment", "--comment", comment,
            "-j", "ACCEPT"]


def iptables_egress_line(cidr, ports, comment=COMMENT):
    return "-A OUTPUT " + " ".join(iptables_egress_rule(cidr, ports, comment))


def _iptables_dst(args):
    for i, a in enumerate(args[:-1]):
        if a == "-d":
            with contextlib.suppress(ValueError):
                return ipaddress.ip_network(args[i + 1], strict=False)
    return None


def _covers(have, want):
    """Whether every port range (lo, hi) of `want` lies within one of `have` (None: the rule names no port)."""
    return have is None or all(any(a <= lo and hi <= b for a, b in have) for lo, hi in want or ())


def _iptables_dports(args):
    """The `--dport(s)` of a rule's arguments as [(lo, hi)] (None: none; [] when unreadable, covering nothing)."""
    for i, a in enumerate(args[:-1]):
        if a in ("--dport", "--dports"):
            try:
                return [tuple(int(x) for x in (p.split(":") * 2)[:2]) for p in args[i + 1].split(",")]
            except ValueError:
                return []
    return None


def iptables_has_egress(save_text, cidr, ports=None):
    """Whether the filter table's OUTPUT chain has ddpfix's accept to `cidr` (for every port range of `ports`),
    whichever run added it."""
    want = ipaddress.ip_network(cidr, strict=False)
    return any(is_ddpfix_comment(c) and _iptables_dst(args) == want and args[-2:] == ["-j", "ACCEPT"]
               and _covers(_iptables_dports(args), ports) for args, c in _iptables_input_rules(save_text, "OUTPUT"))


def nft_egress_args(cidr, ports, comment=COMMENT):
    """The egress accept, as nft arguments after `insert rule FAMILY TABLE CHAIN`."""
    spec = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ports)
    return ["ip", "daddr", cidr, "tcp", "dport", "{ " + spec + " }", "accept", "comment", f'"{comment}"']


def nft_egress_line(family, table, chain, cidr, ports, comment=COMMENT):
    return "insert rule {} {} {} {}".format(family, table, chain, " ".join(nft_egress_args(cidr, ports, comment)))


_NFT_INGRESS_LINE = re.compile(r'insert rule (\S+) (\S+) (\S+) ip saddr (\S+) accept comment "[^"]*"')
_NFT_EGRESS_LINE = re.compile(
    r'insert rule (\S+) (\S+) (\S+) ip daddr (\S+) tcp dport \{ ([0-9, -]+) \} accept comment "[^"]*"')


def _snippet_rules(text, line, cidr):
    """The groups (family, table, chain, network, ...) of the lines of an include file of ddpfix's that `line`
    matches, for the cluster network `cidr` (lines for another network left out)."""
    want = ipaddress.ip_network(cidr, strict=False)
    for ln in (text or "").splitlines():
        m = line.fullmatch(ln.strip())
        with contextlib.suppress(ValueError):
            if m and ipaddress.ip_network(m.group(4), strict=False) == want:
                yield m.groups()


def nft_snippet_ingress(text, cidr):
    """The input chains an include file of ddpfix's lets the cluster network `cidr` in through (`nft_snippet`),
    checked as `nft_chains_checked` checks planned ones: what a run that plans no input chain (egress only) keeps."""
    out = []
    for fam, table, chain, _net in _snippet_rules(text, _NFT_INGRESS_LINE, cidr):
        with contextlib.suppress(ValueError):
            out += nft_chains_checked([{"family": fam, "table": table, "chain": chain}])
    return list(dict.fromkeys(out))


def nft_snippet_egress(text, cidr):
    """The egress accepts an include file of ddpfix's holds (`nft_egress_line`) for the cluster network `cidr`, checked
    as `egress_change` checks a planned one: what a later run keeps when its own plan does not name that chain again
    (the live accept lets the connects out, so nothing is planned there)."""
    out = []
    for fam, table, chain, _net, ports in _snippet_rules(text, _NFT_EGRESS_LINE, cidr):
        with contextlib.suppress(ValueError):
            out.append(egress_change({"backend": "nftables", "family": fam, "table": table, "chain": chain,
                                      "ports": ports.replace(", ", ",")}, cidr))
    return out


def _nft_daddr(expr):
    for e in expr or []:
        m = e.get("match") if isinstance(e, dict) else None
        left = m.get("left") if isinstance(m, dict) else None
        if isinstance(left, dict) and left.get("payload") == {"protocol": "ip", "field": "daddr"}:
            right = m.get("right")
            with contextlib.suppress(KeyError, ValueError, TypeError):
                if isinstance(right, dict) and isinstance(right.get("prefix"), dict):
                    return ipaddress.ip_network("{}/{}".format(right["prefix"]["addr"], right["prefix"]["len"]),
                                                strict=False)
                return ipaddress.ip_network(right, strict=False)
    return None


def _nft_dports(expr):
    """The `tcp dport` of an nft rule as [(lo, hi)] (None: it names none; [] when unreadable, covering nothing)."""
    def span(e):
        if isinstance(e, dict) and isinstance(e.get("range"), list) and len(e["range"]) == 2:
            return tuple(e["range"])
        return (e, e)
    for e in expr or []:
        m = e.get("match") if isinstance(e, dict) else None
        if isinstance(m, dict) and m.get("left") == {"payload": {"protocol": "tcp", "field": "dport"}}:
            right = m.get("right")
            got = [span(x) for x in (right["set"] if isinstance(right, dict) and "set" in right else [right])]
            ok = m.get("op") in ("==", "in") and all(isinstance(x, int) for sp in got for x in sp)
            return got if ok else []
    return None


def nft_has_egress(ruleset, chain, cidr, comment=None, ports=None):
    """Whether `chain` (family, table, name) has ddpfix's accept to `cidr` (for every port range of `ports`; tagged
    `comment`, or by any run) ahead of its first drop/reject rule."""
    want = ipaddress.ip_network(cidr, strict=False)
    for it in _items(ruleset):
        r = it.get("rule")
        if not r or (r.get("family"), r.get("table"), r.get("chain")) != tuple(chain):
            continue
        tagged = r.get("comment") == comment if comment else is_ddpfix_comment(r.get("comment"))
        if (tagged and {"accept": None} in (r.get("expr") or []) and _nft_daddr(r.get("expr")) == want
                and _covers(_nft_dports(r.get("expr")), ports)):
            return True
        if _is_drop_expr(r.get("expr")):
            return False
    return False


# --------------------------------------------------------------------------- nftables

def _items(ruleset):
    return (ruleset or {}).get("nftables", []) or []


def _is_drop_expr(expr):
    text = repr(expr)
    return "'drop'" in text or "'reject'" in text


def iptables_nft_tables(save_text):
    """The tables `iptables-nft-save` prints as its own (`*filter`, ...): those iptables-nft can read. A table it
    cannot (hand-written in nft, whatever its chain names) shows as "# Table `filter' is incompatible"."""
    lines = (save_text or "").splitlines()
    foreign = {m.group(1) for ln in lines for m in [re.match(r"# Table `([^']+)' .*incompatible", ln)] if m}
    return {ln[1:].strip() for ln in lines if ln.startswith("*")} - foreign


def nft_iptables_owned(ruleset, ip_tables=None, ip6_tables=None):
    """(family, table) of the nft tables iptables-nft owns, by evidence: listed by `iptables-nft-save` (ip) /
    `ip6tables-nft-save` (ip6) as their own (None: that tool is not installed, so iptables-nft wrote nothing), or
    holding an `xt` expression (a match or target only iptables-nft writes). Never by chain names: a native
    `table ip filter` with chains INPUT/FORWARD/OUTPUT is nftables.service's."""
    owned = {("ip", t) for t in ip_tables or ()} | {("ip6", t) for t in ip6_tables or ()}
    for it in _items(ruleset):
        r = it.get("rule")
        if r and r.get("family") in ("ip", "ip6") and "'xt'" in repr(r.get("expr")):
            owned.add((r["family"], r.get("table")))
    return owned


def nft_blocking_input_chains(ruleset, iptables_owned=()):
    """Native nftables base chains on the input hook (ip/inet) that can drop: policy drop, or a drop/reject
    rule of their own (a chain that only jumps elsewhere, like kube-proxy's, is left alone). firewalld's tables and
    the tables iptables-nft owns (`iptables_owned`, from `nft_iptables_owned`) are skipped: those layers have their
    own backends."""
    items = _items(ruleset)
    chains = []
    owned = set(map(tuple, iptables_owned))
    for it in items:
        c = it.get("chain")
        if not c or c.get("hook") != "input" or c.get("family") not in ("ip", "inet"):
            continue
        key = (c["family"], c["table"], c["name"])
        if (c["family"], c["table"]) in SKIP_NFT_TABLES or (c["family"], c["table"]) in owned:
            continue
        blocks = c.get("policy") == "drop"
        if not blocks:
            for r in items:
                r = r.get("rule")
                if r and (r.get("family"), r.get("table"), r.get("chain")) == key and _is_drop_expr(r.get("expr")):
                    blocks = True
                    break
        if blocks:
            chains.append(key)
    return chains


def nft_tagged(ruleset, comment=COMMENT):
    """(family, table, chain, handle) of every rule tagged with `comment`."""
    out = []
    for it in _items(ruleset):
        r = it.get("rule")
        if r and r.get("comment") == comment:
            out.append((r["family"], r["table"], r["chain"], int(r["handle"])))
    return out


def _nft_saddr(expr):
    """The network an nft rule's `ip saddr ==` match names (None when it has none)."""
    for e in expr or []:
        m = e.get("match") if isinstance(e, dict) else None
        left = m.get("left") if isinstance(m, dict) else None
        if not (isinstance(left, dict) and left.get("payload") == {"protocol": "ip", "field": "saddr"}
                and m.get("op") in ("==", "in")):
            continue
        right = m.get("right")
        try:
            if isinstance(right, dict) and isinstance(right.get("prefix"), dict):
                return ipaddress.ip_network("{}/{}".format(right["prefix"]["addr"], right["prefix"]["len"]),
                                            strict=False)
            if isinstance(right, str):
                return ipaddress.ip_network(right, strict=False)
        except (KeyError, ValueError):
            return None
    return None


def nft_has_rule(ruleset, chain, cidr):
    """Whether `chain` (family, table, name) has ddpfix's accept from `cidr`, whichever run added it."""
    want = ipaddress.ip_network(cidr, strict=False)
    for it in _items(ruleset):
        r = it.get("rule")
        if (r and (r.get("family"), r.get("table"), r.get("chain")) == tuple(chain)
                and is_ddpfix_comment(r.get("comment")) and {"accept": None} in (r.get("expr") or [])
                and _nft_saddr(r.get("expr")) == want):
            return True
    return False


def nft_rule_args(cidr, comment=COMMENT):
    return ["ip", "saddr", cidr, "accept", "comment", f'"{comment}"']


#: The first line of ddpfix's nftables include file after the shebang: how a file of ddpfix's own is recognised.
NFT_SNIPPET_MARK = "# Managed by ddpfix: lets the cluster network in"
#: Where nft looks for an include path that is neither absolute nor starts with ./ or ../ (`nft --help`: -I).
NFT_INCLUDE_DIR = "/etc"


def nft_snippet(chains, cidr, comment=COMMENT, egress=()):
    """The include file: only ddpfix's rules (`egress`: checked egress changes, `egress_change`), inserted into
    chains the main config has defined by then."""
    out = ["#!/usr/sbin/nft -f",
           NFT_SNIPPET_MARK + " (loaded by an include at the end of the main config, after its tables).",
           "# Only ddpfix's own rule lives here; remove the include block from the main config to drop it."]
    for fam, table, chain in chains:
        out.append("insert rule {} {} {} {}".format(fam, table, chain, " ".join(nft_rule_args(cidr, comment))))
    for _backend, fam, table, chain, ports in egress:
        out.append(nft_egress_line(fam, table, chain, cidr, ports, comment))
    return "\n".join(out) + "\n"


def is_ddpfix_snippet(text):
    """Whether an include file's text is one ddpfix wrote (its marker line near the top)."""
    return any(ln.startswith(NFT_SNIPPET_MARK) for ln in (text or "").splitlines()[:3])


_BLOCK = re.compile(rf"^{re.escape(BEGIN)}\n(.*?)^{re.escape(END)}\n?", re.M | re.S)
_INCLUDE = re.compile(r'(?:^|[\s;{])include\s+"([^"\n]*)"')


def without_include(text):
    """Main config text without ddpfix's managed include block (and the blank line it was appended after)."""
    m = _BLOCK.search(text)
    if not m:
        return text
    head, tail = text[:m.start()], text[m.end():]
    if not tail.strip() and head.endswith("\n\n"):
        head = head[:-1]
    return head + tail


def block_include(text):
    """The path ddpfix's managed block includes ("" when there is no block)."""
    m = _BLOCK.search(text)
    inc = _INCLUDE.search(m.group(1)) if m else None
    return inc.group(1) if inc else ""


def with_include(text, include_path):
    """Main config text with one managed block that includes `include_path`, at the very end: after every table of
    the config (an old block elsewhere is removed), so ddpfix's `insert rule` lines find their chains."""
    text = without_include(text)
    block = f"{BEGIN}\ninclude \"{include_path}\"\n{END}\n"
    if text and not text.endswith("\n"):
        text += "\n"
    return text + ("\n" if text.strip() else "") + block


def nft_includes(text):
    """The include patterns of an nftables file (comments skipped), ddpfix's managed block left out."""
    text = without_include(text)
    lines = []
    for ln in text.splitlines():
        # a comment runs from `#` to the end of the line (a `#` inside quotes is not one)
        out, quoted = [], False
        for ch in ln:
            if ch == '"':
                quoted = not quoted
            elif ch == "#" and not quoted:
                break
            out.append(ch)
        lines.append("".join(out))
    return _INCLUDE.findall("\n".join(lines))


def nft_include_path(pattern):
    """The absolute pattern nft resolves an include to (relative names are looked up in /etc; ./ and ../ from the
    working directory, / under systemd)."""
    if pattern.startswith("/"):
        return pattern
    if pattern.startswith(("./", "../")):
        return "/" + pattern
    return NFT_INCLUDE_DIR + "/" + pattern


def glob_matches(pattern, path):
    """Whether glob(3) (which nft uses for includes) would return `path` for `pattern`: one path segment per
    pattern segment, `*`/`?`/`[...]` never match `/`, nor a leading dot unless the pattern has it."""
    pat = [s for s in pattern.split("/") if s not in ("", ".")]
    got = [s for s in path.split("/") if s not in ("", ".")]
    if len(pat) != len(got):
        return False
    for p, g in zip(pat, got):
        if g.startswith(".") and not p.startswith("."):
            return False
        if not fnmatch.fnmatchcase(g, p):
            return False
    return True


def nft_rule_ahead(ruleset, chain, comment=COMMENT):
    """Whether chain (family, table, name) holds a rule tagged `comment` ahead of its first drop/reject rule."""
    for it in _items(ruleset):
        r = it.get("rule")
        if not r or (r.get("family"), r.get("table"), r.get("chain")) != tuple(chain):
            continue
        if r.get("comment") == comment:
            return True
        if _is_drop_expr(r.get("expr")):
            return False
    return False


# --------------------------------------------------------------------------- ufw

def ufw_allows(user_rules, cidr):
    """Whether ufw's rules file (/etc/ufw/user.rules, whose `### tuple ###` lines are what `ufw status` lists) holds
    an incoming allow of every protocol and port, to any address, from a network containing `cidr`: a rule limited
    to a port, a protocol, an application, an interface or a destination does not count."""
    want = ipaddress.ip_network(cidr, strict=False)
    for ln in (user_rules or "").splitlines():
        if not ln.startswith("### tuple ###"):
            continue
        fields = ln[len("### tuple ###"):].split(" comment=")[0].split()
        if len(fields) != 7:  # 9 fields: an application rule (dapp, sapp)
            continue
        action, proto, dport, dst, sport, src, ifaces = fields
        if action.split("_")[0] != "allow" or ifaces != "in":
            continue
        if (proto, dport, sport) != ("any", "any", "any") or dst not in ("0.0.0.0/0", "any"):
            continue
        try:
            net = ipaddress.ip_network(src, strict=False)
        except ValueError:
            continue
        if (net.version == want.version and net.network_address <= want.network_address
                and want.broadcast_address <= net.broadcast_address):
            return True
    return False


# --------------------------------------------------------------------------- firewalld

#: A firewalld zone or policy name (firewall-cmd's limit: it becomes part of nft chain names).
FIREWALLD_NAME = re.compile(r"^[A-Za-z0-9_-]{1,17}$")
#: The only rich rules ddpfix adds: the cluster network as source (a zone) or destination (a policy from HOST).
RICH_FROM = 'rule family="ipv4" source address="{cidr}" accept'
RICH_TO = 'rule family="ipv4" destination address="{cidr}" accept'


def fwd_changes(changes, cidr, zone):
    """The firewalld changes of the plan, checked: each a dict with `zone` or `policy` (a firewalld name) and
    `source` (the cluster network) or `rich_rule` (one of ddpfix's two rules for the cluster network). An empty
    plan, or a source for the zone "": the cluster network as a source of `zone`. ValueError naming what is wrong."""
    net = str(ipaddress.ip_network(cidr, strict=False))
    out = []
    for c in changes or [{"zone": zone, "source": net}]:
        if not isinstance(c, dict):
            raise ValueError(f"a firewalld change must be a dict, got {c!r}")
        kind = "zone" if "zone" in c else "policy"
        name = c.get(kind)
        if kind == "zone" and name == "" and "source" in c:
            name = zone  # the plan's "no zone holds the cluster network": the configured zone
        if not isinstance(name, str) or not FIREWALLD_NAME.match(name):
            raise ValueError(f"firewalld {kind} name {name!r} is not 1-17 letters, digits, '_' or '-'")
        if "source" in c:
            if kind != "zone" or c["source"] != net:
                raise ValueError(f"only the cluster network {net} becomes a zone source, got {c!r}")
            out.append((kind, name, "source", net))
        elif c.get("rich_rule") in (RICH_FROM.format(cidr=net), RICH_TO.format(cidr=net)):
            out.append((kind, name, "rich-rule", c["rich_rule"]))
        else:
            raise ValueError(f"only ddpfix's rich rules for {net} are added, got {c.get('rich_rule')!r}")
    return out


def fwd_argv(change, op, permanent):
    """firewall-cmd's argument list to query/add/remove one checked change (`fwd_changes`): a list, never a
    string a shell or a split would see."""
    kind, name, what, value = change
    return ["firewall-cmd", *(["--permanent"] if permanent else []), f"--{kind}={name}", f"--{op}-{what}={value}"]
