"""Plain-text tables for command output and the library functions that format it (no
heavy imports: quick commands use it too)."""

from __future__ import annotations


def render_table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell; the first left-aligned, the rest right."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])
