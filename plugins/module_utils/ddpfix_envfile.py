"""The env file's managed block: stdlib-only, pure functions shared by the ``ddpfix_env_file`` module (writes the
block), the ``ddpfix_node_facts`` module (reads it; ``roles/ddpfix_facts/module_utils`` holds a symlink to this
file) and the controller (renders the block, loaded by path).

Design: ddpfix's keys live between ``# BEGIN ddpfix managed block`` and ``# END ddpfix managed block``. Everything
outside the block is the user's and kept verbatim, except assignments of a key the block sets: bash ``set -a; .``,
systemd ``EnvironmentFile=`` and ``docker --env-file`` all let the last assignment win, so such a line is turned
into a comment (``# ddpfix: superseded: <line>``) rather than left to shadow (or be shadowed by) the block.
A file written by ddpfix before the block existed starts with ``# Managed by ddpfix:``; it is converted (its
ddpfix keys move into the block, other lines are kept). Any other existing file is the user's: it is only changed
with ``adopt`` (``ddp_env_adopt: true``) or when it lies in ddpfix's own directory ``/etc/ddpfix/`` (a file
written there by hand before ddpfix ran), and then only by adding the block and neutralising duplicates.

Secret-looking values (``is_secret``: a key naming KEY, TOKEN, SECRET, PASS, PWD, AUTH, CREDENTIAL, DSN, COOKIE or
SESSION, any case, or PAT, WEBHOOK or HOOK_URL as a word; or a value holding URL userinfo ``scheme://user[:password]@``,
a webhook URL, a URL query credential or a provider's token format: ``SECRET_VALUE_RE``) never leave the node: diffs and
facts carry ``***`` instead, and the facts carry a salted HMAC of each (``secret_digests``) so that the controller
can tell whether the node holds the planned value without seeing it.
"""

from __future__ import absolute_import, division, print_function

import hashlib
import hmac
import os
import re

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_block import BEGIN, END

__metaclass__ = type

NOTE = "# Written by ddpfix (ddpfix env --apply): lines up to the END marker are replaced; keep your own keys outside."
OLD_HEADER = "# Managed by ddpfix:"  # first line of the whole-file format ddpfix wrote before the block
SUPERSEDED = "# ddpfix: superseded: "
REDACTED = "***"
#: A key whose name contains one of these (any case) holds a secret. Substrings, not words: PGPASSWORD, APIKEY and
#: MYSQL_PWD are secrets, and so (false positives that only hide a value) are MONKEY and KEYBOARD.
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASS", "PWD", "AUTH", "CREDENTIAL", "DSN", "COOKIE", "SESSION")
#: A key with one of these as a word (between underscores or at an end) holds a secret: GH_PAT, GITLAB_PAT (not
#: PATH, PYTHONPATH).
SECRET_KEY_WORDS_RE = re.compile(r"(?:^|_)(?:PAT|WEBHOOK|HOOK_URL)(?:_|$)")
#: A value with URL userinfo (``scheme://user:password@host``, also a bare token ``https://TOKEN@host``) is secret.
URL_USERINFO_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]+@")
#: A value holding one of these is secret whatever its key: webhook URLs (their path is the credential), URL query
#: credentials, and the token formats of common providers (their documented prefixes). Matched anywhere in the value,
#: so a token inside a URL or a command line is found too; ``redact`` replaces each match by ***.
SECRET_VALUE_RE = re.compile("|".join([
    r"hooks\.slack\.com/(?:services|workflows|triggers)/[^\s\"']+",  # Slack incoming webhooks / workflows
    r"(?:discord(?:app)?\.com|canary\.discord\.com)/api/webhooks/[^\s\"']+",  # Discord webhooks
    r"[A-Za-z0-9.-]*\.webhook\.office\.com/[^\s\"']+",  # Microsoft Teams incoming webhooks
    r"outlook\.office(?:365)?\.com/webhook/[^\s\"']+",
    r"chat\.googleapis\.com/v1/spaces/[^\s\"']*[?&]key=[^\s\"']+",  # Google Chat webhooks
    r"api\.telegram\.org/bot[0-9]+:[A-Za-z0-9_-]+",  # Telegram bot token in its URL
    r"[?&](?:access_token|auth|token|api_?key|apikey|key|sig|signature|secret|password|passwd|pwd)=[^&#\s\"']+",
    r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained PAT
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack bot/user/app tokens
    r"\bxapp-[0-9]+-[A-Za-z0-9-]{10,}",
    r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bglpat-[A-Za-z0-9_-]{20,}",  # GitLab personal access tokens
    r"\bgl(?:dt|rt|ptt|cbt|oas)-[A-Za-z0-9_-]{20,}",  # other GitLab tokens
    r"\bsk-(?:proj-|ant-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}",  # OpenAI / Anthropic API keys
    r"\bhf_[A-Za-z0-9]{30,}",  # Hugging Face tokens
    r"\bpypi-AgE[A-Za-z0-9_-]{20,}",  # PyPI API tokens
    r"\bnpm_[A-Za-z0-9]{36}\b",  # npm tokens
    r"\bAIza[0-9A-Za-z_-]{35}",  # Google API keys
    r"\b(?:sk|rk)_live_[0-9A-Za-z]{20,}",  # Stripe secret keys
    r"\bSG\.[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{20,}",  # SendGrid
    r"\bdop_v1_[a-f0-9]{64}",  # DigitalOcean
    r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+",  # a JSON web token
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
]))
#: Keys the whole-file format held; dropped when such a file is converted to the block.
OLD_KEYS = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE", "RANK",
            "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
#: ddpfix's own directory: an existing file there (e.g. written by hand following the README) is adopted without
#: ddp_env_adopt, since no other program owns it. Adopting keeps every line (duplicates of ddpfix's keys commented).
OWN_DIR = "/etc/ddpfix"
#: Directories the env file (or a symlink's target) may not live in.
FORBIDDEN_DIRS = ("/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run/user")

KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SAFE_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:/=@%+^-]*$")  # whole value (fullmatch: no trailing newline)
MAX_VALUE_LEN = 4096
_ASSIGN_RE = re.compile(r"^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class NotOurs(Exception):
    """The file exists and was not written by ddpfix."""


def is_secret(key, value=None):
    """Whether `key` (with `value`, when given) is secret-looking: the one place that decides it, for the node modules
    and the controller alike."""
    k = str(key).upper()
    if any(w in k for w in SECRET_WORDS) or SECRET_KEY_WORDS_RE.search(k):
        return True
    return value is not None and bool(URL_USERINFO_RE.search(str(value)) or SECRET_VALUE_RE.search(str(value)))


def secret_digest(salt, value):
    """HMAC-SHA256 of `value` keyed with `salt` (hex): equal values give equal digests under one salt."""
    return hmac.new(str(salt).encode("utf-8", "surrogateescape"), str(value).encode("utf-8", "surrogateescape"),
                    hashlib.sha256).hexdigest()


def new_salt():
    return os.urandom(16).hex()


def secret_digests(values, salt):
    """{key: digest} of the secret-looking entries of `values`."""
    return {k: secret_digest(salt, v) for k, v in values.items() if is_secret(k, v)}


def same_secret(salt, digest, value):
    """Whether `digest` (from a node, under `salt`) is the digest of `value`."""
    return isinstance(salt, str) and isinstance(digest, str) and bool(salt) and hmac.compare_digest(
        digest, secret_digest(salt, value))


def forbidden_dir(path):
    """The forbidden directory `path` lies in, or None."""
    for d in FORBIDDEN_DIRS:
        if path == d or path.startswith(d + "/"):
            return d
    return None


def in_own_dir(path):
    return bool(path) and path.startswith(OWN_DIR + "/")


def may_adopt(path, target, adopt):
    """Whether a foreign file at `path` (resolving to `target`) may get the block."""
    return bool(adopt) or (in_own_dir(path) and in_own_dir(target or path))


def _open_quote(value, quote=None):
    """The quote still open at the end of `value` (None: closed), starting inside `quote`."""
    i = 0
    while i < len(value):
        c = value[i]
        if quote is None:
            if c in "\"'":
                quote = c
            elif c == "\\":
                i += 1
            elif c == "#" and (i == 0 or value[i - 1].isspace()):
                break
        elif c == quote:
            quote = None
        elif c == "\\" and quote == '"':
            i += 1
        i += 1
    return quote


def statements(lines):
    """Group physical lines into statements: [(first, last, key or None, commented)].

    An assignment (``KEY=value``, ``export KEY=value``, also behind ``#``) spans the lines its quotes or a
    trailing backslash continue over. `key` is None for other lines."""
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        body = line.lstrip()
        commented = body.startswith("#")
        if commented:
            body = body.lstrip("#").lstrip()
        m = _ASSIGN_RE.match(body)
        if not m:
            out.append((i, i, None, commented))
            i += 1
            continue
        value, last = m.group(3), i
        quote = _open_quote(value)
        while last + 1 < len(lines) and (quote is not None or lines[last].endswith("\\")):
            last += 1
            quote = _open_quote(lines[last], quote)
        out.append((i, last, m.group(2), commented))
        i = last + 1
    return out


def _blocks(lines):
    """[(begin, end)] line indexes of the managed blocks (a BEGIN without a later END is not a block)."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == BEGIN:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == END), None)
            if end is not None:
                out.append((i, end))
                i = end + 1
                continue
        i += 1
    return out


def ownership(text):
    """'block' (has ddpfix's block), 'header' (whole file written by an older ddpfix), 'empty' or 'foreign'."""
    if not text.strip():
        return "empty"
    lines = text.splitlines()
    if _blocks(lines):
        return "block"
    first = next((ln for ln in lines if ln.strip()), "")
    if first.startswith(OLD_HEADER):
        return "header"
    return "foreign"


def managed_text(text):
    """The text ddpfix manages in `text`: the block's lines, or the whole old-format file; '' if foreign."""
    lines = text.splitlines()
    blocks = _blocks(lines)
    if blocks:
        b, e = blocks[0]
        return "\n".join(lines[b + 1:e]) + "\n"
    return text if ownership(text) == "header" else ""


def outside_keys(text):
    """Keys assigned (not commented) outside the managed block, in order, unique."""
    lines = text.splitlines()
    inside = set()
    for b, e in _blocks(lines):
        inside.update(range(b, e + 1))
    keys = []
    for first, _last, key, commented in statements(lines):
        if key and not commented and first not in inside and key not in keys:
            keys.append(key)
    return keys


def check_values(values):
    """Error message for a key or value the block cannot hold unquoted (same meaning for bash, systemd, docker)."""
    for k, v in values.items():
        if not KEY_RE.fullmatch(str(k)):
            return f"env key {k!r} is not a valid variable name"
        if len(str(v)) > MAX_VALUE_LEN:
            return f"env value of {k} is {len(str(v))} characters long: at most {MAX_VALUE_LEN} are written"
        if not SAFE_VALUE_RE.fullmatch(str(v)):
            return (f"env value {k}={v!r} would need quoting, and bash (set -a; .), systemd EnvironmentFile= and "
                    "docker --env-file would not read it alike (docker keeps quotes and backslashes): only letters, "
                    "digits and _ . , : / = @ % + ^ - are written")
    return None


def render_block(values, comment="", key_comments=None):
    """The managed block's lines; `key_comments` (key -> why) puts a `# KEY: why` line above a key."""
    lines = [BEGIN, NOTE]
    if comment:
        lines.append("# " + " ".join(str(comment).split()))
    for k, v in values.items():
        why = (key_comments or {}).get(k)
        if why:
            lines.append("# {}: {}".format(k, " ".join(str(why).split())))
        lines.append(f"{k}={v}")
    return [*lines, END]


def parse_body(body):
    """A block body (the rendered template): (lines, values, error).

    `lines` are its lines without blank ones at either end; `values` its KEY=VALUE assignments in order. Every line
    must be blank, a ``#`` comment or ``KEY=VALUE``; `error` names the first line that is not, a key assigned twice,
    or a value that `check_values` refuses."""
    lines = str(body).splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    values = {}
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if line != text or "=" not in text:
            return lines, values, f"env template line {n} is not KEY=VALUE (no spaces around it): {line!r}"
        key, value = text.split("=", 1)
        if key in values:
            return lines, values, f"env template line {n} assigns {key} a second time"
        values[key] = value
    return lines, values, check_values(values)


def body_block(lines):
    """The managed block's lines around a parsed body (`parse_body`)."""
    return [BEGIN, NOTE] + [ln for ln in lines if ln.strip() not in (BEGIN, END)] + [END]


def merge(text, values, comment="", adopt=False, block=None, key_comments=None):
    """`text` with the block set to `values` (or to `block`, its lines, when given: a rendered template whose
    assignments are `values`). Returns (new_text, superseded_keys).

    Raises NotOurs for a foreign file unless `adopt`. Lines outside the block are kept; an assignment of a
    managed key outside the block is commented out with the SUPERSEDED marker. An existing block stays where
    it is; a new block goes at the end."""
    owner = ownership(text)
    if owner == "foreign" and not adopt:
        raise NotOurs()
    lines = text.splitlines()
    blocks = _blocks(lines)
    drop = set()
    for b, e in blocks:
        drop.update(range(b, e + 1))
    at = blocks[0][0] if blocks else None
    if owner == "header":
        first = next(i for i, ln in enumerate(lines) if ln.strip())
        drop.add(first)
        if first + 1 < len(lines) and lines[first + 1].startswith("# node "):
            drop.add(first + 1)
    out, superseded = [], []
    block = block if block is not None else render_block(values, comment, key_comments)
    for first, last, key, commented in statements(lines):
        if first in drop:
            if first == at:
                out.extend(block)
            continue
        chunk = lines[first:last + 1]
        if key and not commented and owner == "header" and key in OLD_KEYS:
            continue
        if key and not commented and key in values:
            chunk = [SUPERSEDED + ln for ln in chunk]
            if key not in superseded:
                superseded.append(key)
        out.extend(chunk)
    if at is None:
        while out and not out[-1].strip():
            out.pop()
        out = out + ([""] if out else []) + block
    return "\n".join(out) + "\n", superseded


def redact(text):
    """`text` with the value of every secret-looking assignment (commented ones too, and values continued over
    several lines) replaced by ***; any other line holding URL userinfo is replaced by its redaction too."""
    lines = str(text).splitlines()
    out = []
    for first, last, key, _commented in statements(lines):
        chunk = lines[first:last + 1]
        if key:
            line = lines[first]
            idx = line.index(key + "=") + len(key) + 1
            if is_secret(key, "\n".join([line[idx:], *chunk[1:]])):
                out.append(line[:idx] + REDACTED)
                continue
        out.extend(SECRET_VALUE_RE.sub(REDACTED, URL_USERINFO_RE.sub(_userinfo_redacted, ln)) for ln in chunk)
    return "\n".join(out) + ("\n" if str(text).endswith("\n") else "")


def _userinfo_redacted(m):
    return m.group(0).split("://", 1)[0] + "://" + REDACTED + "@"


def redact_values(values):
    return {k: REDACTED if is_secret(k, v) else v for k, v in values.items()}
