"""The search page at GET /: a query box, two model pickers whose answers show side by side (as
`pgembed demo` prints them), a filter box, k, hybrid. One self-contained document: no external
script, style, font or image. Its form fields are named as POST /search's JSON fields (text,
model, k, filter, hybrid; `compare` is the second column's model), and its script posts them.
Hits are written with textContent, never as HTML.
"""

from __future__ import annotations

from html import escape

from pgembed.search.planner import MAX_K

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>pgembed search</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 1.5rem auto; max-width: 72rem;
       padding: 0 1rem; color: #222; }
form { display: grid; grid-template-columns: repeat(6, auto); gap: .5rem; align-items: end; }
label { display: flex; flex-direction: column; font-size: 12px; color: #555; }
label.wide { grid-column: 1 / -1; }
input, select, button { font: inherit; padding: .3rem .4rem; }
input[name=k] { width: 5rem; }
label.check { flex-direction: row; gap: .3rem; align-items: center; }
#columns { display: grid; grid-template-columns: 1fr 1fr; gap: 1.5rem; margin-top: 1rem; }
h2 { font-size: 15px; margin: 0 0 .4rem; }
ol { padding-left: 1.4rem; margin: 0; }
li { margin-bottom: .5rem; }
.score { font-variant-numeric: tabular-nums; color: #555; margin-right: .4rem; }
.key { color: #888; font-size: 12px; margin-left: .4rem; }
.error { color: #b00020; }
.took { color: #888; font-size: 12px; }
</style>
</head>
<body>
<h1>pgembed search</h1>
<noscript><p class="error">This page needs JavaScript; the API is POST /search
(see docs/serve.md).</p></noscript>
<form id="search" method="post" action="/search">
<label class="wide">Query <input name="text" type="search" required autofocus
  placeholder="battery drains fast"></label>
<label>Model <select name="model"><!--options--></select></label>
<label>Side by side with <select name="compare">
<option value="">(none)</option><!--compare--></select></label>
<label>Filter (JSON) <input name="filter" placeholder='{"rating": {"$gte": 4}}'></label>
<label>k <input name="k" type="number" value="10" min="1" max="<!--max-k-->"></label>
<label class="check"><input name="hybrid" type="checkbox" value="true"> hybrid</label>
<button type="submit">Search</button>
</form>
<div id="columns"><section id="left"></section><section id="right"></section></div>
<script>
const form = document.getElementById("search");
function show(section, title, answer, error) {
  section.replaceChildren();
  const h = document.createElement("h2");
  h.textContent = title;
  section.append(h);
  if (error) {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = error;
    section.append(p);
    return;
  }
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
    li.append(score, document.createTextNode(hit.text), key);
    list.append(li);
  }
  const took = document.createElement("p");
  took.className = "took";
  took.textContent = answer.hits.length + " hits in " + answer.took_ms + " ms";
  section.append(list, took);
}
async function search(model, request, section) {
  if (!model) { section.replaceChildren(); return; }
  try {
    const response = await fetch("/search", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({...request, model}),
    });
    const answer = await response.json();
    show(section, model, answer, response.ok ? null : answer.error);
  } catch (e) {
    show(section, model, null, String(e));
  }
}
form.addEventListener("submit", (event) => {
  event.preventDefault();
  const data = new FormData(form);
  const request = {text: data.get("text"), k: Number(data.get("k") || 10)};
  if (data.get("hybrid")) request.hybrid = true;
  const left = document.getElementById("left"), right = document.getElementById("right");
  const filter = (data.get("filter") || "").trim();
  if (filter) {
    try { request.filter = JSON.parse(filter); } catch (e) {
      show(left, "filter", null, "the filter is not valid JSON: " + e.message);
      right.replaceChildren();
      return;
    }
  }
  search(data.get("model"), request, left);
  search(data.get("compare"), request, right);
});
</script>
</body>
</html>
"""


def render(models: list[str]) -> str:
    """The page, its pickers listing `models` (the second one preselects the second model)."""
    options = "".join(_option(name, i == 0) for i, name in enumerate(models))
    compare = "".join(_option(name, i == 1) for i, name in enumerate(models))
    page = _PAGE.replace("<!--max-k-->", str(MAX_K))
    return page.replace("<!--options-->", options).replace("<!--compare-->", compare)


def _option(name: str, selected: bool) -> str:
    value = escape(name, quote=True)
    return f'<option value="{value}"{" selected" if selected else ""}>{value}</option>'
