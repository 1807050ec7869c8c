"""The search page at GET /: a query box, two model pickers whose answers show side by side (as
`pgembed demo` prints them), a filter box, k, hybrid. One self-contained document: no external
script, style or font (its icon is /favicon.svg, same origin). Its form fields are named as
POST /search's JSON fields (text, model, k, filter, hybrid; `compare` is the second column's
model), and its script posts them with "row": true, to show each hit's other columns.

What the script keeps true: the results shown are those of the query shown (each column's
earlier request is aborted, and an answer that is not its column's latest is dropped); a column
says "searching..." while it waits; the query is in the URL (?text=...&model=..., or
?similar_to=KEY&model=...), so a search can be shared and Back shows the one before; "more like
this" on a hit searches for the rows like it. Hits are written with textContent, never as HTML.
Without models (the database is down when the page is asked for), the page says so and asks
GET /models again every few seconds.

The default model: the one in the URL; else the one this browser searched last; else the one
this server answered last; else the first by name that is not CLS-pooled (mean pooling is what
sentence-transformers checkpoints are trained for; `pgembed demo`'s CLS model is its worse
one); else the first (default_model).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from html import escape

from pgembed.search.planner import MAX_K

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 1.5rem auto; max-width: 72rem;
       padding: 0 1rem; color: #222; }
form { display: flex; flex-wrap: wrap; gap: .5rem; align-items: flex-end; }
label { display: flex; flex-direction: column; font-size: 12px; color: #555; min-width: 0; }
label.wide { flex: 1 1 100%; }
label.grow { flex: 1 1 10rem; }
input, select, button { font: inherit; padding: .3rem .4rem; max-width: 100%;
                        box-sizing: border-box; }
input[name=k] { width: 5rem; }
label.check { flex-direction: row; gap: .3rem; align-items: center; }
#columns { display: grid; grid-template-columns: 1fr 1fr; gap: 1.5rem; margin-top: 1rem; }
@media (max-width: 40rem) { #columns { grid-template-columns: 1fr; } }
h2 { font-size: 15px; margin: 0 0 .4rem; }
ol { padding-left: 1.4rem; margin: 0; }
li { margin-bottom: .6rem; overflow-wrap: anywhere; }
.score { font-variant-numeric: tabular-nums; color: #555; margin-right: .4rem; }
.key { color: #888; font-size: 12px; margin-left: .4rem; }
.row { color: #555; font-size: 12px; margin: .1rem 0 0; }
.row span { margin-right: .8rem; }
.more { font-size: 12px; padding: 0 .3rem; margin-left: .4rem; }
.error, #down { color: #b00020; }
.took, .busy { color: #888; font-size: 12px; }
.busy::before { content: "\\231B  "; }
section[aria-busy=true] ol { opacity: .4; }
"""

_SCRIPT = """
const form = document.getElementById("search");
const columns = {left: document.getElementById("left"), right: document.getElementById("right")};
const latest = {left: 0, right: 0};
const pending = {left: null, right: null};
const FIELDS = ["text", "model", "compare", "filter", "k", "hybrid", "similar_to"];

function heading(section, title) {
  section.replaceChildren();
  const h = document.createElement("h2");
  h.textContent = title;
  section.append(h);
}
function line(section, className, text) {
  const p = document.createElement("p");
  p.className = className;
  p.textContent = text;
  section.append(p);
}
function hitsText(n) { return n === 1 ? "1 hit" : n + " hits"; }
function show(section, model, answer) {
  heading(section, model);
  const list = document.createElement("ol");
  for (const hit of answer.hits) {
    const li = document.createElement("li");
    const score = document.createElement("span");
    score.className = "score";
    const value = hit.similarity !== undefined ? hit.similarity : hit.score;
    score.textContent = value.toFixed(hit.similarity !== undefined ? 3 : 4);
    const key = document.createElement("span");
    key.className = "key";
    key.textContent = "#" + hit.key;
    const more = document.createElement("button");
    more.type = "button";
    more.className = "more";
    more.textContent = "more like this";
    more.addEventListener("click", () => {
      const params = current();
      delete params.text;
      go({...params, similar_to: String(hit.key), model}, true);
    });
    li.append(score, document.createTextNode(hit.text), key, more);
    const row = hit.row || {};
    if (Object.keys(row).length) {
      const p = document.createElement("p");
      p.className = "row";
      for (const [name, cell] of Object.entries(row)) {
        const span = document.createElement("span");
        const shown = typeof cell === "string" ? cell : JSON.stringify(cell);
        const cut = shown.length > 120 ? shown.slice(0, 120) + "\\u2026" : shown;
        span.textContent = name + ": " + cut;
        p.append(span);
      }
      li.append(p);
    }
    list.append(li);
  }
  section.append(list);
  line(section, "took", hitsText(answer.hits.length) + " in " + answer.took_ms + " ms");
}
async function search(side, model, request, filter) {
  const section = columns[side];
  const ticket = ++latest[side];
  if (pending[side]) pending[side].abort();
  pending[side] = null;
  if (!model) { section.replaceChildren(); section.removeAttribute("aria-busy"); return; }
  const controller = new AbortController();
  pending[side] = controller;
  section.setAttribute("aria-busy", "true");
  const old = section.querySelector(".busy, .took");
  if (old) old.remove();
  if (!section.querySelector("h2")) heading(section, model);
  line(section, "busy", "searching\\u2026");
  try {
    let body = JSON.stringify({...request, model, row: true});
    // The filter as typed, not JSON.parse's copy: its numbers keep their digits (a double
    // would round 4.50000000000000001 to 4.5), as the server reads them.
    if (filter) body = body.slice(0, -1) + ',"filter":' + filter + "}";
    const response = await fetch("/search", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body,
      signal: controller.signal,
    });
    const answer = await response.json();
    if (ticket !== latest[side]) return;  // a newer search owns this column
    section.removeAttribute("aria-busy");
    if (response.ok) {
      show(section, model, answer);
      try { localStorage.setItem("pgembed.model", request.model || model); } catch (e) {}
    } else {
      heading(section, model);
      line(section, "error", answer.error);
    }
  } catch (e) {
    if (ticket !== latest[side]) return;
    section.removeAttribute("aria-busy");
    heading(section, model);
    line(section, "error", String(e));
  }
}
function fill(params) {
  for (const name of FIELDS) {
    const field = form.elements[name];
    if (!field) continue;
    const value = params[name];
    if (field.type === "checkbox") field.checked = value === "true";
    else if (value !== undefined) field.value = value;
    else if (name === "k") field.value = "10";
    else if (field.tagName !== "SELECT") field.value = "";
  }
}
function current() {
  const data = new FormData(form);
  const params = {};
  for (const name of FIELDS) {
    const value = data.get(name);
    if (value !== null && value !== "") params[name] = String(value);
  }
  return params;
}
function go(params, push) {
  fill(params);
  const all = current();
  if (params.similar_to !== undefined) delete all.text; else delete all.similar_to;
  if (push) history.pushState(all, "", "?" + new URLSearchParams(all).toString());
  run(all);
}
function run(params) {
  const request = {k: Number(params.k || 10)};
  let title = "";
  if (params.similar_to !== undefined) {
    request.similar_to = params.similar_to;
    title = "rows like #" + params.similar_to;
  } else {
    if (!params.text) return;
    request.text = params.text;
    if (params.hybrid === "true") request.hybrid = true;
  }
  document.getElementById("like").textContent = title;
  const filter = (params.filter || "").trim();
  if (filter) {
    try { JSON.parse(filter); } catch (e) {
      ++latest.left; ++latest.right;
      heading(columns.left, "filter");
      line(columns.left, "error", "the filter is not valid JSON: " + e.message);
      columns.right.replaceChildren();
      return;
    }
  }
  search("left", params.model, request, filter);
  search("right", params.compare, request, filter);
}
form.addEventListener("submit", (event) => {
  event.preventDefault();
  form.elements.similar_to.value = "";
  go(current(), true);
});
window.addEventListener("popstate", () => {
  go(Object.fromEntries(new URLSearchParams(location.search)), false);
});
const fromUrl = Object.fromEntries(new URLSearchParams(location.search));
if (!fromUrl.model) {
  let remembered = null;
  try { remembered = localStorage.getItem("pgembed.model"); } catch (e) {}
  const picker = form.elements.model;
  const known = [...picker.options].some((o) => o.value === remembered);
  if (remembered && known) picker.value = remembered;
}
if (Object.keys(fromUrl).length) go(fromUrl, false);
async function waitForModels() {
  try {
    const response = await fetch("/models");
    if (!response.ok) throw new Error((await response.json()).error);
    const names = (await response.json()).models.map((m) => m.name);
    const picker = form.elements.model, compare = form.elements.compare;
    for (const name of names) {
      picker.append(new Option(name, name));
      compare.append(new Option(name, name));
    }
    document.getElementById("down").remove();
  } catch (e) {
    document.getElementById("down-why").textContent = String(e.message || e);
    setTimeout(waitForModels, 3000);
  }
}
if (document.getElementById("down")) setTimeout(waitForModels, 3000);
"""

FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<circle cx="6.5" cy="6.5" r="4.5" fill="none" stroke="#2a6" stroke-width="2"/>'
    '<path d="M10 10l4.5 4.5" stroke="#2a6" stroke-width="2.4" stroke-linecap="round"/></svg>'
)


def _hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


# The page's policy: its own inline script and style (by hash) and nothing else.
CSP = (
    f"default-src 'none'; script-src {_hash(_SCRIPT)}; style-src {_hash(_STYLE)}; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>pgembed search</title>
<link rel="icon" href="/favicon.svg" type="image/svg+xml">
<style><!--style--></style>
</head>
<body>
<h1>pgembed search</h1>
<noscript><p class="error">This page needs JavaScript; the API is POST /search
(see docs/serve.md).</p></noscript>
<!--down-->
<form id="search" method="post" action="/search">
<label class="wide">Query <input name="text" type="search" autofocus
  placeholder="battery drains fast"></label>
<input name="similar_to" type="hidden" value="">
<label class="grow">Model <select name="model"><!--options--></select></label>
<label class="grow">Side by side with <select name="compare">
<option value="">(none)</option><!--compare--></select></label>
<label class="grow">Filter (JSON)
  <input name="filter" placeholder='{"rating": {"$gte": 4}}'></label>
<label>k <input name="k" type="number" value="10" min="1" max="<!--max-k-->"></label>
<label class="check"><input name="hybrid" type="checkbox" value="true"> hybrid</label>
<button type="submit">Search</button>
</form>
<p id="like" class="took"></p>
<div id="columns"><section id="left"></section><section id="right"></section></div>
<script><!--script--></script>
</body>
</html>
"""


def default_model(models: Sequence[tuple[str, str | None]], last_used: str | None) -> str | None:
    """The model the page preselects among (name, pooling) pairs, by name (the URL's and the
    browser's own choice come first, in its script): the one this server answered last, else the
    first not CLS-pooled, else the first."""
    names = [name for name, _ in models]
    if last_used in names:
        return last_used
    for name, pooling in models:
        if pooling != "cls":
            return name
    return names[0] if names else None


def render(models: list[str], default: str | None = None, down: str | None = None) -> str:
    """The page, its pickers listing `models` with `default` selected (the second picker the
    first other model). `down`: why there are none (the database is down): the page says so."""
    default = default if default in models else (models[0] if models else None)
    others = [name for name in models if name != default]
    options = "".join(_option(name, name == default) for name in models)
    compare = "".join(_option(name, bool(others) and name == others[0]) for name in models)
    banner = ""
    if down is not None:
        banner = (
            '<p id="down">No models to search: <span id="down-why">'
            f"{escape(down)}</span>. This page asks again every few seconds.</p>"
        )
    page = _PAGE.replace("<!--max-k-->", str(MAX_K)).replace("<!--down-->", banner)
    page = page.replace("<!--style-->", _STYLE).replace("<!--script-->", _SCRIPT)
    return page.replace("<!--options-->", options).replace("<!--compare-->", compare)


def _option(name: str, selected: bool) -> str:
    value = escape(name, quote=True)
    return f'<option value="{value}"{" selected" if selected else ""}>{value}</option>'
