"""Turn chart specs and table rows into one self-contained HTML page (and PNGs).

The page inlines Vega, Vega-Lite and vega-embed (the bundle vl-convert ships, the
same one Altair's ``save(..., inline=True)`` uses), so it opens with no network;
each chart is a Vega-Lite spec embedded as JSON and drawn by vega-embed.

Escaping: the template is rendered with Jinja's autoescape, so names that come
from logs (models, tenants, files, scenarios) are HTML-escaped; the specs are JSON
with ``<``, ``>``, ``&`` and the JavaScript line separators written as ``\\uXXXX``,
so no string in them can end the ``<script>`` element they sit in.
"""

from __future__ import annotations

import functools
import json
import math
import os
from datetime import date, datetime
from pathlib import Path
from typing import Any

import jinja2

from pipeline.text import DASH, format_count, format_duration, format_number

REPORTS_DIR = Path(__file__).resolve().parents[2] / "reports"
TEMPLATES_DIR = REPORTS_DIR / "templates"

_SCRIPT_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def script_json(obj: Any) -> str:
    """JSON that is safe inside a <script> element (nothing can close or comment it)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for char, escaped in _SCRIPT_ESCAPES.items():
        text = text.replace(char, escaped)
    return text


def cache_dir() -> Path:
    """Where built artefacts that depend only on package versions are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tracereplay"


@functools.cache
def vega_bundle() -> tuple[str, str, str]:
    """(JavaScript of vega + vega-lite + vega-embed, vl-convert version, Vega-Lite version).

    vl-convert bundles the JavaScript on every call (about 2 s), and the bundle
    depends only on the two versions, so it is kept in ``cache_dir()``; an
    unwritable cache only costs the time.
    """
    import vl_convert
    from altair.utils._importers import vl_version_for_vl_convert

    vl_version = vl_version_for_vl_convert()
    vlc_version = str(getattr(vl_convert, "__version__", "unknown"))
    cached = cache_dir() / f"vega-embed-bundle_vl-convert-{vlc_version}_{vl_version}.js"
    try:
        js = cached.read_text(encoding="utf-8")
    except OSError:
        # The stub wants a snippet; None is what Altair passes for the plain bundle.
        js = vl_convert.javascript_bundle(None, vl_version=vl_version)  # type: ignore[arg-type]
        try:
            write_atomic(cached, js)
        except OSError:
            pass
    # The bundle holds no "</script" or "<!--" today; make sure it never ends its element.
    js = js.replace("</script", "<\\/script").replace("<!--", "<\\!--")
    return js, vlc_version, vl_version.replace("_", ".")


def fmt(value: Any, kind: str) -> tuple[str, bool]:
    """A table cell as (text, is_numeric). Null is a dash. Kinds: ``int`` (a count: ``3``),
    ``float`` (four significant digits, trailing zeros dropped), ``duration`` (seconds, in
    the unit that reads: ``183 ms``, ``7.7 h``), ``pct``, ``time``, ``text``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH, kind not in ("text", "json")
    if isinstance(value, bool):
        return ("yes" if value else "no"), False
    if kind == "int":
        return format_count(value), True
    if kind == "float":
        return format_number(float(value)), True
    if kind == "duration":
        return format_duration(float(value)), True
    if kind == "pct":
        return f"{float(value) * 100:.1f}%", True
    if kind == "time":
        if isinstance(value, datetime):
            return value.strftime("%Y-%m-%d %H:%M:%S"), False
        if isinstance(value, date):
            return value.isoformat(), False
    return str(value), False


def render_page(template: str, context: dict[str, Any]) -> str:
    """Render ``reports/templates/<template>`` with autoescaping."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
    )
    js, vlc_version, vl_version = vega_bundle()
    return env.get_template(template).render(
        vega_bundle=js, vl_convert_version=vlc_version, vegalite_version=vl_version, **context
    )


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_atomic_bytes(path: Path, data: bytes) -> Path:
    """``write_atomic`` for bytes: no half file, no temporary file left when it fails."""
    from pipeline.storage import write_atomic as write

    return write(path, data)


def write_pngs(specs: dict[str, dict[str, Any]], out_dir: Path, scale: float = 2.0) -> list[Path]:
    """One PNG per chart spec (``<chart id>.png``), drawn by vl-convert without a browser."""
    import vl_convert
    from altair.utils._importers import vl_version_for_vl_convert

    vl_version = vl_version_for_vl_convert()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for chart_id, spec in specs.items():
        png = vl_convert.vegalite_to_png(spec, vl_version=vl_version, scale=scale)
        paths.append(write_atomic_bytes(out_dir / f"{chart_id}.png", png))
    return paths
