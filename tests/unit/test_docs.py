"""The docs as a reader meets them: the README is the way in (at most 300 lines, the set-up commands, the five
commands, the exit codes, where to read on), the reference is the site under docs/ (mkdocs.yml: every page in the nav
but the generated finding pages, which the findings table links), and the links of the top-level Markdown files
resolve (the site's own links are checked by `mkdocs build --strict`, scripts/docs.sh, which .ci/run runs)."""

from __future__ import annotations

import re
import tomllib

import yaml
from unit_helpers import ROOT

from ddpfix.errors import ExitCode

TOP = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "BENCHMARKS.md")


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_the_readme_is_short_and_says_what_a_newcomer_needs() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for heading in ("## Quick start", "## Your own cluster", "## The five commands", "## Exit codes", "## Read on"):
        assert f"\n{heading}" in text, heading
    for cmd in ("audit", "remediate", "env", "verify", "explain"):
        assert re.search(rf"^    ddpfix {cmd} ", text, re.M), cmd
    for code in ExitCode:
        assert f"\n| {int(code)} |" in text, code


def test_top_level_links_resolve() -> None:
    for name in TOP:
        for link in _links((ROOT / name).read_text()):
            if link.startswith(("http://", "https://", "mailto:", "#")):
                continue
            assert (ROOT / link.split("#")[0]).exists(), f"{name}: {link}"


def _nav(items: list[object]) -> list[str]:
    out: list[str] = []
    for item in items:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out += _nav(value) if isinstance(value, list) else [str(value)]
    return out


def test_every_hand_written_page_is_in_the_nav() -> None:
    conf = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = set(_nav(conf["nav"]))
    docs = ROOT / conf["docs_dir"]
    pages = {str(p.relative_to(docs)) for p in docs.rglob("*.md")}
    findings = {p for p in pages if p.startswith("findings/") and p != "findings/index.md"}
    assert nav <= pages, sorted(nav - pages)
    assert pages - findings == nav, sorted(pages - findings - nav)
    assert conf["strict"] is True and conf["validation"]["links"]["anchors"] == "warn"


def test_ci_builds_the_site_with_the_pinned_mkdocs() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["lint"]
    assert any(re.fullmatch(r"mkdocs==[\d.]+", req) for req in lint), lint
    assert "./scripts/docs.sh" in (ROOT / ".ci" / "run").read_text()
    script = (ROOT / "scripts" / "docs.sh").read_text()
    assert "build --strict" in script and "tools.generate --check" in script
