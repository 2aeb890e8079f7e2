"""The command line as documented: every `ddpfix ...` line of the README and docs/, of `--help` and of the fix texts parses;
global options work before and after the subcommand; ad-hoc host lists; internal errors exit 3 with one line."""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from unit_helpers import ROOT

from ddpfix.app import Application
from ddpfix.cli import cli, load_commands
from ddpfix.errors import ExitCode
from ddpfix.inventory.derive import load_cluster
from ddpfix.inventory.sources import host_list_data, resolve_inventories, split_inventory_env
from ddpfix.rules import firewall as firewall_rules

PKG = ROOT / "controller" / "ddpfix"
SUBCOMMANDS = ("audit", "remediate", "env", "verify", "lab")


# ---------------------------------------------------------------------------------------------- extraction
def _readme_commands(text: str) -> list[str]:
    """Command lines of the README: code lines (indented or fenced) starting with `ddpfix` or `sudo ... ddpfix`,
    with their `[...]` continuation lines, and every inline code span starting with `ddpfix `."""
    out: list[str] = []
    fenced = False
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        code = fenced or line.startswith("    ")
        s = line.strip()
        if code and re.match(r"^(sudo\s+(\S+=\S+\s+)*)?\S*ddpfix\s", s) and not re.match(r"^ddpfix \S+:", s):
            # (a line of ddpfix's own output, "ddpfix audit: 3 hosts ...", is not a command)
            j = i + 1
            while j < len(lines) and lines[j].startswith("    ") and lines[j].strip().startswith("["):
                s += " " + lines[j].strip()
                j += 1
            out.append(s)
        out += re.findall(r"`((?:sudo [^`]*)?ddpfix [^`]+)`", line)
    return out


def _help_commands() -> list[str]:
    commands = load_commands()
    texts = [cli.help or "", commands["lab"].help or ""] + [c.help or "" for c in commands.values()]
    out = []
    for t in texts:
        for line in t.splitlines():
            s = line.split("#", 1)[0].strip()
            if s.startswith("ddpfix "):
                out.append(s)
    return out


def _option_takes_value(tokens: list[str], opt: str) -> bool:
    load_commands()
    cmds: list[click.Command] = [cli]
    group: click.Command = cli
    for t in tokens:
        if isinstance(group, click.Group) and t in group.commands:
            group = group.commands[t]
            cmds.append(group)
    for c in cmds:
        for p in c.params:
            if isinstance(p, click.Option) and opt in (*p.opts, *p.secondary_opts):
                return not (p.is_flag or p.count)
    return False


def _strings(path: Path) -> Iterator[str]:
    """The string literals of a module (an f-string with `{}` for each replacement field)."""
    nodes = list(ast.walk(ast.parse(path.read_text())))
    pieces = {id(v) for n in nodes if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in nodes:
        if isinstance(node, ast.JoinedStr):
            yield "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in pieces:
            yield node.value


def _code_commands() -> list[str]:
    """`ddpfix <subcommand> [options]` in the package's strings (fix texts, messages), cut where prose starts."""
    out = []
    strip = ".,;:)'`"
    for path in sorted(PKG.rglob("*.py")):
        for text in _strings(path):
            for m in re.finditer(rf"\bddpfix (?=(?:{'|'.join(SUBCOMMANDS)})\b)", text):
                words = text[m.end():].split("\n", 1)[0].split()
                cmd = [words[0].rstrip(strip)]
                rest = words[1:]
                if cmd[0] == "lab":  # prose about the lab, unless a lab command follows
                    if not rest or rest[0].rstrip(strip) not in ("up", "down", "status"):
                        continue
                    cmd.append(rest.pop(0).rstrip(strip))
                while rest and rest[0].startswith("-"):
                    opt = rest.pop(0).rstrip(strip)
                    cmd.append(opt)
                    if _option_takes_value(cmd, opt.split("=")[0]) and "=" not in opt and rest:
                        cmd.append(rest.pop(0).rstrip(strip))
                out.append("ddpfix " + " ".join(cmd))
    return sorted(set(out))


def _samples(tmp: Path) -> dict[str, str]:
    inv = tmp / "hosts.yml"
    inv.write_text("ddp_nodes:\n  hosts: {node1: {}, node2: {}}\n")
    (tmp / "dir").mkdir(exist_ok=True)
    log = tmp / "job.log"
    log.write_text("RuntimeError: Gloo connectFullMesh failed with ... Connect timeout [none]\n")
    varfile = tmp / "site.yml"
    varfile.write_text("ddp_cluster_cidr: 192.168.77.0/24\n")
    return {"VARFILE": str(varfile), "LOG": str(log), "job.log": str(log), "LIST": "node[1-2]", "INV": str(inv), "INVENTORY": str(inv), "FILE": str(tmp / "report.json"), "DIR": str(tmp / "dir"),
            "ID": firewall_rules.MASTER_PORT_BLOCKED.id, "K": "2", "S": "1.5", "N": "3", "CIDR": "192.168.77.0/24",
            "NAME": "clean", "LAB": "lab1", "PATTERN": "node1", "IF": "eth0", "GBPS": "50"}


def _expand(line: str, samples: dict[str, str]) -> Iterator[list[str]]:
    """A documented line as concrete argv lists: synopsis brackets dropped, the first of `a|b` and `--x/--no-x`,
    `lab up/down/status` as three commands, placeholders replaced by sample values."""
    line = re.sub(r"\s+#\s.*$", "", line)  # a shell comment after the command
    line = re.sub(r"\[,[A-Z]+\.\.\.\]|,\.\.\.", "", line)
    words = shlex.split(line.replace("[", " ").replace("]", " "))
    words = words[next(i for i, w in enumerate(words) if w.endswith("ddpfix")) + 1:]
    variants: list[list[str]] = [[]]
    for w in words:
        if "|" in w:
            w = w.split("|")[0]
        if w.startswith("-") and "/" in w:
            w = w.split("/")[0]
        if not w.startswith("-") and "/" in w and variants[0][-1:] == ["lab"]:
            variants = [[*v, alt] for v in variants for alt in w.split("/")]
            continue
        w = samples.get(w, w)
        variants = [[*v, w] for v in variants]
    yield from variants


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Application]]:
    """Replace every leaf command's callback: parse only, record (command, application)."""
    calls: list[tuple[str, Application]] = []

    def leaves(group: click.Group) -> Iterator[click.Command]:
        for c in group.commands.values():
            if isinstance(c, click.Group):
                yield from leaves(c)
            else:
                yield c

    load_commands()
    for c in leaves(cli):
        def fake(*_: Any, __name: str = c.name or "", **__: Any) -> None:
            calls.append((__name, click.get_current_context().find_object(Application)))

        monkeypatch.setattr(c, "callback", fake)
    return calls


# ---------------------------------------------------------------------------------------------- documented forms
def _documented() -> list[str]:
    """The command lines of the README and of every docs page (the reference moved from the README to docs/)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [c for p in pages for c in _readme_commands(p.read_text())]


def test_extraction_finds_the_documented_commands() -> None:
    readme = _readme_commands((ROOT / "README.md").read_text())
    assert any(c.startswith("ddpfix audit -i inventories/prod") for c in readme)
    assert len(readme) >= 10
    docs = _documented()
    assert any(c.startswith("ddpfix audit -i INV") for c in docs)
    assert any(c.startswith("ddpfix lab up") for c in docs)
    assert len(docs) >= 100
    assert "ddpfix audit -i inventories/prod" in _help_commands()
    code = _code_commands()
    assert "ddpfix env -i INVENTORY --apply" in code and "ddpfix remediate --apply" in code


def test_every_documented_command_line_parses(tmp_path: Path, recorded: list[tuple[str, Application]]) -> None:
    samples = _samples(tmp_path)
    lines = (_documented() + _help_commands() + _code_commands())
    checked = 0
    for line in lines:
        for argv in _expand(line, samples):
            recorded.clear()
            r = CliRunner().invoke(cli, argv, env={"DDPFIX_INVENTORY": None})
            assert r.exit_code == 0, f"{line!r} -> {argv}: exit {r.exit_code}: {r.output}"
            if "--help" in argv:
                assert "Usage:" in r.output, argv
                continue
            assert len(recorded) == 1, argv
            if "-i" in argv:
                app = recorded[0][1]
                assert app.inventories == (argv[argv.index("-i") + 1],), (argv, app)
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("sub", ["audit", "remediate", "env", "verify"])
def test_global_options_before_and_after_the_subcommand(sub: str, recorded: list[tuple[str, Application]]) -> None:
    for argv in (["-i", "a.yml", "--limit", "n1", "--forks", "3", "-vv", sub],
                 [sub, "-i", "a.yml", "--limit", "n1", "--forks", "3", "-vv"],
                 [sub, "--inventory", "a.yml", "--limit=n1", "--forks=3", "--verbose", "-v"]):
        recorded.clear()
        r = CliRunner().invoke(cli, argv, env={"DDPFIX_INVENTORY": None})
        assert r.exit_code == 0, (argv, r.output)
        app = recorded[0][1]
        assert (app.inventories, app.limit, app.forks, app.verbosity) == (("a.yml",), "n1", 3, 2), argv


def test_values_after_the_subcommand_override(recorded: list[tuple[str, Application]]) -> None:
    r = CliRunner().invoke(cli, ["-i", "a.yml", "-i", "b.yml", "--limit", "x", "--forks", "2", "-v",
                                 "audit", "-i", "c.yml", "--limit", "y", "--forks", "9", "-vvv"])
    assert r.exit_code == 0, r.output
    app = recorded[0][1]
    assert (app.inventories, app.limit, app.forks, app.verbosity) == (("c.yml",), "y", 9, 3)
    recorded.clear()
    r = CliRunner().invoke(cli, ["-i", "a.yml", "--limit", "x", "verify", "--torch"])
    assert (recorded[0][1].inventories, recorded[0][1].limit) == (("a.yml",), "x")  # not given after: kept


def test_command_line_beats_the_environment(recorded: list[tuple[str, Application]], tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["audit", "-i", "cli.yml"], env={"DDPFIX_INVENTORY": "env.yml", "DDPFIX_LIMIT": "n2"})
    assert r.exit_code == 0, r.output
    assert (recorded[0][1].inventories, recorded[0][1].limit) == (("cli.yml",), "n2")


def test_bad_option_after_the_subcommand_is_one_line() -> None:
    r = CliRunner().invoke(cli, ["audit", "-i", "x.yml", "--forks", "0"])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "--forks" in r.output and r.output.startswith("ddpfix: error:")


# ---------------------------------------------------------------------------------------------- DDPFIX_INVENTORY
def test_ddpfix_inventory_env_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a.yml").write_text("{}\n")
    Path("b.yml").write_text("{}\n")
    assert split_inventory_env("a.yml") == ("a.yml",)
    assert split_inventory_env("a.yml,b.yml") == ("a.yml", "b.yml")  # every part a path: several inventories
    assert split_inventory_env(" a.yml , b.yml ") == ("a.yml", "b.yml")
    assert split_inventory_env("a.yml,b.yml,") == ("a.yml,b.yml,",)  # trailing comma: Ansible's host list
    assert split_inventory_env("node1,node2") == ("node1,node2",)  # not all paths: one ad-hoc host list
    assert split_inventory_env("a.yml,node2") == ("a.yml,node2",)
    assert split_inventory_env("") == ()


def test_ddpfix_inventory_env_reaches_the_application(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      recorded: list[tuple[str, Application]]) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a b.yml").write_text("{}\n")  # a space in a path: click alone would split it
    Path("c.yml").write_text("{}\n")
    for value, want in (("a b.yml,c.yml", ("a b.yml", "c.yml")), ("n1,n2,", ("n1,n2,",))):
        recorded.clear()
        r = CliRunner().invoke(cli, ["audit"], env={"DDPFIX_INVENTORY": value})
        assert r.exit_code == 0, r.output
        assert recorded[0][1].inventories == want


# ---------------------------------------------------------------------------------------------- ad-hoc host lists
def test_host_list_data() -> None:
    assert host_list_data("node1,node2,") == {"ddp_nodes": {"hosts": {"node1": {}, "node2": {}}}}
    assert host_list_data("10.0.0.1:2222,[fd00::2]:22,n3") == {
        "ddp_nodes": {"hosts": {"10.0.0.1": {"ansible_port": 2222}, "fd00::2": {"ansible_port": 22}, "n3": {}}}}
    for bad in ("a b,c,", "x;rm,", ",,", "inventories/typo,"):
        with pytest.raises(Exception) as exc:
            host_list_data(bad)
        assert getattr(exc.value, "code", None) == ExitCode.INVALID_INPUT and repr(bad) in str(exc.value), bad


def test_host_list_becomes_a_real_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    paths = resolve_inventories(("node1,node2:2201,", str(inv)))
    assert paths[1] == str(inv) and paths[0].startswith(str(tmp_path / "state" / "runs"))
    cluster = load_cluster(paths)  # real ansible-inventory
    assert cluster.names == ["node1", "node2"] and cluster.master == "node1"


def test_missing_inventory_is_invalid_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    for argv in (["audit", "-i", str(tmp_path / "nope.yml")], ["-i", "inventories/typo,more", "env"]):
        r = CliRunner().invoke(cli, argv)
        assert r.exit_code == 2 and r.output.count("\n") == 1 and "inventory not found" in r.output, r.output


# ---------------------------------------------------------------------------------------------- internal errors
def test_internal_error_exits_3_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError from ansible-runner (like `Argument list too long` with 320 hosts) is no finding: exit 3."""
    import ansible_runner

    def boom(**_: Any) -> None:
        raise OSError(7, "Argument list too long")

    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(ansible_runner, "run", boom)
    inv = tmp_path / "hosts.yml"
    inv.write_text("ddp_nodes:\n  hosts: {node1: {}, node2: {}}\n")
    r = CliRunner().invoke(cli, ["remediate", "-i", str(inv)])
    assert r.exit_code == int(ExitCode.RUN_FAILED), r.output
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ddpfix: error: ddpfix remediate failed in ansible.run.run_playbook (OSError: ")
    assert "Argument list too long" in lines[0]
    assert f"run log: {tmp_path / 'state' / 'runs'}/" in lines[0]
    assert "Traceback" not in r.stderr


def test_internal_error_traceback_only_with_verbose(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ddpfix.cli.audit as audit_cli

    def broken(*_: Any, **__: Any) -> None:
        raise KeyError("hostvars")

    monkeypatch.setattr(audit_cli, "inventory_of", lambda app: ("x.yml",))
    monkeypatch.setattr(audit_cli.pipeline, "audit", broken)
    r = CliRunner().invoke(cli, ["audit", "-i", "x.yml"])
    assert r.exit_code == 3 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr == ("ddpfix: error: ddpfix audit failed in cli.audit.command (KeyError: 'hostvars') "
                        "(-v shows the traceback)\n")
    for argv in (["audit", "-i", "x.yml", "-v"], ["-v", "audit", "-i", "x.yml"]):
        r = CliRunner().invoke(cli, argv)
        assert r.exit_code == 3
        assert "Traceback (most recent call last)" in r.stderr and "in broken" in r.stderr
        assert r.stderr.splitlines()[-1] == "ddpfix: error: ddpfix audit failed in cli.audit.command (KeyError: 'hostvars')"


def test_run_checks_failure_is_run_failed(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in a check (ddpfix.rules.engine.run_checks raising) exits 3, not 1 (findings)."""
    import ddpfix.audit
    import ddpfix.cli.audit as audit_cli
    import ddpfix.rules.engine

    def bad_checks(ctx: Any) -> list:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(ddpfix.rules.engine, "run_checks", bad_checks)  # audit.run_audit imports it when it runs
    monkeypatch.setattr(ddpfix.audit, "collect", lambda cluster, **_: (sim.context(), None))
    monkeypatch.setattr(audit_cli, "inventory_of", lambda app: ("x.yml",))
    r = CliRunner().invoke(cli, ["audit", "-i", "x.yml", "--format", "json"])
    assert r.exit_code == 3 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("ddpfix: error: ddpfix audit failed in audit.run_audit (ZeroDivisionError: division by zero)")
