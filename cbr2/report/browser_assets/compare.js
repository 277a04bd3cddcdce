const app = document.getElementById("app"), R = DATA.runs;
function runLink(run, qid) {
  return el("a", {href: run.href + "#open=" + encodeURIComponent(qid), title: "this question in " + run.label + "'s browser.html"},
            run.label + " ↗");
}
function sideCell(s) {
  return el("td", {}, kv("answer", s.answer, s.kind === "none" ? "ok" : "bad"), kv("error kind", s.kind),
    s.analysis ? kv("error class", s.analysis.class + " · " + s.analysis.reason) : null,
    s.message ? kv("error", s.message) : null,
    code(s.program, "no program parsed"),
    s.program === null || s.program === undefined ? el("details", {}, el("summary", {}, "generated text"), code(s.generated, "empty")) : null);
}
app.append(el("header", {}, el("h1", {}, DATA.title),
  el("p", {class: "summary"}, "Questions that flipped between the base run (first) and each other run; each run's own page (browser.html) has every question."),
  el("ul", {}, R.map(r => el("li", {}, el("a", {href: r.href}, r.label), " · Hits@1 " + pct(r["hits@1"]) + " · n = " + show(r.n),
    r.has_browser ? null : el("span", {class: "note"}, " (no browser.html yet: python -m cbr2.report.browser " + r.dir + ")"))))));
const bar = el("div", {class: "bar"});
const cats = [...new Set(DATA.pairs.flatMap(p => p.flips.map(f => f.category)))].sort();
const [catLab, cat] = select("category", "category", cats);
const dir = el("select", {name: "direction"}, el("option", {value: ""}, "all"),
  el("option", {value: "lost"}, "lost: right → wrong"), el("option", {value: "gained"}, "gained: wrong → right"));
const dirLab = el("label", {}, "direction", dir);
const search = el("input", {type: "search", name: "q", placeholder: "search id, question…"});
const count = el("span", {class: "count", id: "count"});
bar.append(catLab, dirLab, el("label", {}, "search", search), count);
const main = el("main", {});
app.append(bar, main);
const rows = [];
for (const p of DATA.pairs) {
  const A = R[p.a], B = R[p.b];
  const lost = p.flips.filter(f => f.direction === "lost").length, gained = p.flips.length - lost;
  main.append(el("h2", {}, A.label + " vs " + B.label),
    el("p", {class: "summary"}, p.common + " questions in both: " + p.both_right + " right in both, " + p.both_wrong +
      " wrong in both, " + lost + " right → wrong (lost), " + gained + " wrong → right (gained)" +
      (p.only_a || p.only_b ? "; " + p.only_a + " only in " + A.label + ", " + p.only_b + " only in " + B.label : "")));
  if (!p.flips.length) { main.append(el("div", {class: "note"}, "no question flipped")); continue; }
  const table = el("table", {class: "flips"}, el("tr", {}, el("th", {}, "question"),
    el("th", {}, A.label + " (base)"), el("th", {}, B.label)));
  for (const f of p.flips) {
    const tr = el("tr", {class: "flip " + f.direction, "data-id": f.id, "data-direction": f.direction, "data-category": f.category},
      el("td", {}, el("div", {}, el("span", {class: f.direction === "lost" ? "bad" : "ok"},
          f.direction === "lost" ? "✓ → ✗ " : "✗ → ✓ "), el("span", {class: "qid"}, f.id), " ",
          el("span", {class: "tag"}, f.category)),
        el("div", {class: "score"}, "open in ", runLink(A, f.id), " · ", runLink(B, f.id)),
        el("div", {}, f.question || ""), kv("gold answer", f.gold_answer), code(f.gold_program, "no gold program")),
      sideCell(f.a), sideCell(f.b));
    tr._hay = [f.id, f.question, f.a.program, f.b.program].join("\n").toLowerCase();
    rows.push(tr); table.append(tr);
  }
  main.append(table);
}
function apply() {
  const needle = search.value.trim().toLowerCase();
  let shown = 0;
  for (const tr of rows) {
    const ok = (!cat.value || tr.dataset.category === cat.value) && (!dir.value || tr.dataset.direction === dir.value) &&
               (!needle || tr._hay.includes(needle));
    tr.hidden = !ok; if (ok) shown++;
  }
  count.textContent = shown + " of " + rows.length + " flipped questions shown";
}
const p0 = hashParams();
cat.value = p0.get("category") || ""; dir.value = p0.get("direction") || ""; search.value = p0.get("q") || "";
for (const c of [cat, dir]) c.addEventListener("change", apply);
search.addEventListener("input", apply);
apply();
document.body.dataset.ready = "1";
