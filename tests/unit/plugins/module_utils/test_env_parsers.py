"""The env file reads the same in bash (`set -a; . FILE`), systemd (`EnvironmentFile=`) and `docker run --env-file`.

ddpfix writes values unquoted and refuses (`check_values`) every value the three would not read alike. bash is
run for real. systemd and docker are not installed here (and without systemd as PID 1 no unit can be started), so
their grammars are reimplemented below from their documentation and source, with citations:

- systemd: systemd.exec(5), EnvironmentFile= ("an unquoted value after the "=" is parsed with the same
  backslash-escape rules as POSIX shell unquoted text, but unlike in a shell, interior whitespace is preserved and
  quotes after the first non-whitespace character are preserved. Leading and trailing whitespace ... is discarded";
  single quotes keep everything verbatim, double quotes take \\ before " \\ ` $; lines starting with # or ; and
  lines without "=" are ignored), as implemented by src/basic/env-file.c parse_env_file_internal.
- docker: docker/cli pkg/kvfile/kvfile.go parseKeyValueFile (used by opts.ParseEnvFile for --env-file): leading
  whitespace of a line is trimmed, lines starting with # are comments, the key is the text before the first "=",
  and the value is the rest AS IS: no unquoting, no escapes, trailing whitespace kept (docker CLI <= v28). Newer
  docker/cli strips ONE pair of matching surrounding quotes (trimQuotes) and nothing else, so a quoted value
  means two different things depending on the docker version: quoting cannot be used at all.

Hence the rule: a value is written only when it needs no quoting (letters, digits, _ . , : / = @ % + ^ -);
"=" inside a value is fine unquoted in all three (each splits at the first "=").
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from unit_helpers import envfile

# ------------------------------------------------------------------ the parsers


def parse_bash(text: str, tmp: Path) -> dict[str, str] | None:
    """What `set -a; . FILE` exports (None: bash failed on the file)."""
    f = tmp / "ddp.env"
    f.write_text(text)
    keys = [ln.split("=", 1)[0].strip() for ln in text.splitlines() if "=" in ln and not ln.lstrip().startswith("#")]
    script = 'set -a; . "$1" || exit 9; set +a; shift; for k; do if [ -n "${!k+x}" ]; then printf "%s=%s\\0" "$k" "${!k}"; fi; done'
    p = subprocess.run(["bash", "--noprofile", "--norc", "-c", script, "bash", str(f), *keys], capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, timeout=10)
    if p.returncode != 0 or p.stderr:
        return None
    return dict(item.split("=", 1) for item in p.stdout.decode().split("\0") if item)


def parse_systemd(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile= grammar (systemd.exec(5); env-file.c), for single-line assignments."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        s = line.lstrip(" \t\r")
        if not s or s[0] in "#;" or "=" not in s:
            continue
        key, rest = s.split("=", 1)
        key = key.rstrip(" \t")
        rest = rest.lstrip(" \t\r")
        value, i, trailing_ws = "", 0, 0
        while i < len(rest):
            c = rest[i]
            if c == "'":  # single-quoted: verbatim up to the next '
                j = rest.find("'", i + 1)
                j = len(rest) if j < 0 else j
                value += rest[i + 1:j]
                i, trailing_ws = j + 1, 0
                continue
            if c == '"':  # double-quoted: \ escapes only " \ ` $
                i += 1
                while i < len(rest) and rest[i] != '"':
                    if rest[i] == "\\" and i + 1 < len(rest) and rest[i + 1] in '"\\`$':
                        i += 1
                    elif rest[i] == "\\" and i + 1 < len(rest):
                        value += rest[i]
                        i += 1
                    value += rest[i]
                    i += 1
                i, trailing_ws = i + 1, 0
                continue
            if c == "\\" and i + 1 < len(rest):  # unquoted: a backslash keeps the next character
                value += rest[i + 1]
                i, trailing_ws = i + 2, 0
                continue
            value += c
            trailing_ws = trailing_ws + 1 if c in " \t\r" else 0
            i += 1
        out[key] = value[: len(value) - trailing_ws] if trailing_ws else value
    return out


def parse_docker(text: str, trim_quotes: bool) -> dict[str, str]:
    """docker/cli pkg/kvfile parseKeyValueFile (trim_quotes: the newer trimQuotes of one matching pair)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        s = line.lstrip()
        if not s or s[0] == "#":
            continue
        key, has_value, value = s.partition("=")
        if not key or any(c in key for c in " \t"):
            raise ValueError(f"invalid env file line {line!r}")
        if not has_value:
            continue  # looked up in the caller's environment; ddpfix never writes such a line
        if trim_quotes and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def parse_all(text: str, tmp: Path) -> dict[str, dict[str, str] | None]:
    return {"bash": parse_bash(text, tmp), "systemd": parse_systemd(text),
            "docker<=v28": parse_docker(text, False), "docker-trimquotes": parse_docker(text, True)}


needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")

# ------------------------------------------------------------------ the values

VALUES = [
    "eth0", "=eth0", "^docker,lo", "192.168.77.11", "29500", "fd00::1", "a=b=c", "x==y", "", "user@host:/p/a.b+c%2",
    "a b", " lead", "trail ", '"a b"', "'a b'", '"quoted"', "it's", 'say "hi"', "$HOME", "a$b", "${X}", "a#b", "#b",
    "a #b", "a\\b", "a;b", "a`b`", "a|b", "a*", "~", "a\tb",
]


@needs_bash
@pytest.mark.parametrize("value", VALUES)
def test_every_value_is_either_read_alike_or_refused(value: str, tmp_path: Path) -> None:
    refused = envfile().check_values({"K": value})
    got = parse_all(f"K={value}\n", tmp_path)
    alike = all(p is not None and p.get("K") == value for p in got.values())
    assert refused or alike, (value, got)
    if refused:
        assert "would need quoting" in refused and "K=" in refused


@needs_bash
@pytest.mark.parametrize("value", ["=eth0", "a=b=c", "192.168.77.11", "^docker,lo", ""])
def test_equals_and_plain_values_are_accepted_and_read_alike(value: str, tmp_path: Path) -> None:
    assert envfile().check_values({"K": value}) is None
    assert {name: p and p.get("K") for name, p in parse_all(f"K={value}\n", tmp_path).items()} == dict.fromkeys(
        ("bash", "systemd", "docker<=v28", "docker-trimquotes"), value)


@needs_bash
@pytest.mark.parametrize("line", ['K="a b"', "K='a b'", "K=a\\ b", "K=a b"])
def test_no_quoting_of_a_space_reads_alike(line: str, tmp_path: Path) -> None:
    """Why values with spaces are refused rather than quoted: no spelling gives `a b` in all three."""
    got = {name: p and p.get("K") for name, p in parse_all(line + "\n", tmp_path).items()}
    assert len(set(got.values())) > 1, got


@needs_bash
def test_the_written_file_reads_alike(tmp_path: Path) -> None:
    from ddpfix.envtemplate import render_file
    from ddpfix.plan import NodePlan

    env = {"MASTER_ADDR": "192.168.77.11", "MASTER_PORT": "29500", "NNODES": "3", "NODE_RANK": "1",
           "NPROC_PER_NODE": "1", "PET_NNODES": "3", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1",
           "PET_MASTER_ADDR": "192.168.77.11", "PET_MASTER_PORT": "29500", "GLOO_SOCKET_IFNAME": "eth0",
           "NCCL_SOCKET_IFNAME": "=eth0", "TP_SOCKET_IFNAME": "eth0"}
    text = render_file(None, NodePlan("node2", 1, "node2", "192.168.77.12", "eth0", env))
    got = parse_all(text, tmp_path)
    assert all(p == env for p in got.values()), got
