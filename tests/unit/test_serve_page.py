"""The search page's HTML (pgembed/serve/page.py) without a server: the default model, the
pickers, the banner when the database is down, names escaped, and a CSP that allows exactly the
page's own inline script and style."""

from __future__ import annotations

import base64
import hashlib
import re

from pgembed.serve import page


def test_default_model() -> None:
    demo = [("demo_cls", "cls"), ("demo_mean", "mean")]
    assert page.default_model(demo, None) == "demo_mean"  # not alphabetically first
    assert page.default_model(demo, "demo_cls") == "demo_cls"  # the one answered last
    assert page.default_model(demo, "gone") == "demo_mean"
    assert page.default_model([("a", "cls"), ("b", "cls")], None) == "a"
    assert page.default_model([("a", None)], None) == "a"  # the checkpoint's own pooling
    assert page.default_model([], None) is None


def test_pickers_banner_and_escaping() -> None:
    html = page.render(["demo_cls", "demo_mean"], "demo_mean")
    assert '<option value="demo_mean" selected>' in html
    compare = html.split('name="compare"', 1)[1]
    assert '<option value="demo_cls" selected>' in compare  # the first other model
    assert 'id="down"' not in html
    down = page.render([], None, "database unavailable: <connection refused>")
    assert 'id="down"' in down and "&lt;connection refused&gt;" in down
    odd = page.render(['x"><script>'], None)
    assert '<option value="x&quot;&gt;&lt;script&gt;" selected>' in odd


def test_the_csp_allows_the_inline_script_and_style_by_hash() -> None:
    html = page.render(["m"], "m")
    for tag in ("script", "style"):
        [source] = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL)
        digest = base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in page.CSP
    assert "'unsafe-inline'" not in page.CSP and "frame-ancestors 'none'" in page.CSP
