"""The report formats (`--format`) and the file extensions `-o` infers them from: what the CLI needs before a run,
kept apart from the renderers (`ddpfix.render`), which load the rule registry and the checks."""

from __future__ import annotations

from pathlib import Path

#: --format values and the file extensions -o infers them from.
FORMATS = ("text", "table", "json", "plain", "junit", "prometheus", "html")
EXTENSIONS = {".json": "json", ".html": "html", ".htm": "html", ".xml": "junit", ".prom": "prometheus",
              ".txt": "plain"}


def output_format(fmt: str, output: str) -> str:
    """The format `-o output` is written in (`--format`'s when that is a file format, else the extension's, JSON
    when the extension says nothing). ValueError (one line) for a contradiction: an extension that names another
    format than --format, or a bare format name as the file (`-o json`: --format was meant; `-o ./json` writes a
    file of that name)."""
    if output in FORMATS or output in ("xml", "prom", "htm", "txt"):
        raise ValueError(f"-o {output}: a format name, not a file: use --format {EXTENSIONS.get('.' + output, output)}"
                         f" (stdout) or -o ./{output} for a file of that name")
    by_ext = EXTENSIONS.get(Path(output).suffix.lower())
    if fmt in ("text", "table"):
        return by_ext or "json"
    if by_ext and by_ext != fmt:
        raise ValueError(f"-o {output}: the extension {Path(output).suffix} means --format {by_ext}, not --format "
                         f"{fmt}: rename the file or change --format")
    return fmt
