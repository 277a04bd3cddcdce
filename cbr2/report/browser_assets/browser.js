// DATA holds each question's row (id, question, category, verdict, kind, class). The rest sits in
// the blocks after this script, parsed only when needed, so the first page costs about the same at
// 100 or 10,000 questions: "data-0" the run's triples and cases (for an open question), "data-K"
// the details of questions (K - 1) * DATA.chunk onwards. The document's parser reaches those
// blocks after this script has run, hence whenParsed.
const Q = DATA.questions, CHUNK = DATA.chunk;
const blocks = [];
function whenParsed(fn) {
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fn, {once: true});
  else fn();
}
function block(k) {
  if (!blocks[k]) blocks[k] = JSON.parse(document.getElementById("data-" + k).textContent);
  return blocks[k];
}
function detail(i) {  // the whole question
  return Object.assign({}, Q[i], block(1 + Math.floor(i / CHUNK))[i % CHUNK]);
}
const FILTERS = [["category", "category", "category"], ["correct", "correct", "verdict"],
                 ["kind", "error kind", "kind"], ["class", "error class", "class"]];
const app = document.getElementById("app");

function header() {
  const s = DATA.summary, bits = [];
  if (s["hits@1"] !== undefined) bits.push("Hits@1 " + pct(s["hits@1"]), "SER " + pct(s.ser));
  bits.push("n = " + (s.n !== undefined ? s.n : Q.length));
  if (!DATA.has_predictions) bits.push("retrieval only: no predictions");
  return el("header", {}, el("h1", {}, DATA.title),
            el("p", {class: "summary"}, bits.join(" · "), " · ", el("a", {href: "report.md"}, "report.md")));
}

function traceOf(q) {  // the question's trace as build_trace made it: browser.py's _compact undone
  const t = Object.assign({}, q.trace), S = block(0).strings, C = block(0).cases;
  const texts = ids => (ids || []).map(i => S[i]);
  if (t.knowledge) {
    const k = {};
    for (const kind of ["ontology", "facts"]) k[kind] = t.knowledge[kind].map(([i, score]) => ({text: S[i], score: score}));
    t.knowledge = k;
  }
  if (t.cases) t.cases = t.cases.map(([id, found, own]) => {
    const c = C[id] || {}, k = own || c;
    return {id: id, question: c.question === undefined ? null : c.question,
            program: c.program === undefined ? null : c.program,
            found_by: found.map(([view, score]) => ({view: view, score: score})),
            ontology: texts(k.ontology), facts: texts(k.facts)};
  });
  return t;
}

function caseBlock(c, rank) {
  const found = c.found_by.map(f => f.view + (score(f.score) ? " " + score(f.score) : "")).join(", ");
  const d = el("details", {class: "case"},
    el("summary", {}, rank + 1 + ". ", el("span", {class: "qid"}, c.id), " ", el("span", {class: "score"}, found), " ",
       c.question || ""));
  d.addEventListener("toggle", () => {
    if (!d.open || d.dataset.built) return;
    d.dataset.built = "1";
    d.append(code(c.program, "program not known (the benchmark could not be loaded)"),
             el("h3", {}, "its ontology triples"), triples(c.ontology, "ontology triples"),
             el("h3", {}, "its fact triples"), triples(c.facts, "fact triples"));
  });
  return d;
}

function body(i) {
  const q = detail(i), t = traceOf(q), a = q.analysis, g = t.gold || {}, p = t.program || {}, parts = [];
  parts.push(el("div", {class: "grid"},
    el("div", {}, el("h3", {}, "gold"), kv("answer", g.answer), code(g.program, "no gold program")),
    el("div", {}, el("h3", {}, "prediction"),
       kv("answer", t.answer, q.verdict === "right" ? "ok" : "bad"),
       code(p.text, q.verdict === "n/a" ? "not generated" : "no program parsed"))));
  if (q.verdict !== "n/a") {
    const e = t.error, gen = t.generation || {};
    parts.push(el("h3", {}, "verdict"),
      kv("correct", q.verdict, q.verdict === "right" ? "ok" : "bad"), kv("error kind", q.kind),
      e && e.message ? kv("error", e.message) : null, e && e.where ? kv("where", e.where) : null,
      a ? kv("error class", a.class + " · " + a.reason) : null, a && a.detail ? kv("why", a.detail) : null);
    parts.push(el("h3", {}, "steps (each result: how many, the first ones)"), steps(t.steps));
    parts.push(el("h3", {}, "generated text"), code(gen.text, "empty"),
      gen.chars ? el("div", {class: "note"}, "clipped: the model wrote " + gen.chars + " characters") : null,
      kv("repairs", p.repairs && p.repairs.length ? p.repairs : "none"),
      kv("syntax error before / after repair", show(p.syntax_error_before_repair) + " / " + show(p.syntax_error)));
    if (p.unknown_arguments && p.unknown_arguments.length)
      parts.push(kv("arguments outside the KB", p.unknown_arguments.map(u => u.function + " " + u.arg + ": " + u.value)));
    if (p.canonicalized && p.canonicalized.length)
      parts.push(kv("canonicalised", p.canonicalized.map(c => show(c.value) + " → " + show(c.snapped))));
    if (t.fallback) {
      const f = t.fallback.correction, sp = t.fallback.single_pass || {};
      parts.push(el("details", {}, el("summary", {}, "fallback: the correction round (kept: " + show(f.kept) + ")"),
        el("h3", {}, "single pass"), kv("error kind", sp.error_kind), code(sp.generated, "empty"),
        el("h3", {}, "correction"), kv("error kind", f.error_kind), code(f.generated, "empty")));
    }
  }
  if (t.linked) {
    const values = Object.entries(t.linked.values || {}).map(([kind, vs]) => kind + ": " + vs.join(", "));
    parts.push(el("h3", {}, "linked in the question"), kv("entities", t.linked.entities),
      kv("concepts", t.linked.concepts), kv("values", values));
  }
  if (!t.knowledge) {
    parts.push(el("h3", {}, "retrieval"), el("div", {class: "note"},
      DATA.has_retrieval ? "no retrieval record for this question" : "this run wrote no retrieval.jsonl (it retrieved nothing)"));
  } else {
    parts.push(el("div", {class: "grid"},
      el("div", {}, el("h3", {}, "ontology triples (scores)"), triples(t.knowledge.ontology, "ontology triples")),
      el("div", {}, el("h3", {}, "fact triples (scores)"), triples(t.knowledge.facts, "fact triples"))));
    parts.push(el("h3", {}, "cases (views that found them, scores)"),
      t.cases.length ? t.cases.map(caseBlock) : el("div", {class: "note"}, "no cases"));
  }
  if (q.verdict !== "n/a") {
    const pr = t.prompt || {}, gen = t.generation || {};
    const cmd = DATA.prompt_command + " " + (q.index === null || q.index === undefined ? "K" : q.index);
    parts.push(el("details", {}, el("summary", {}, "prompt" + (pr.tokens ? " (" + pr.tokens + " tokens)" : "")),
      pr.text ? code(pr.text) : [el("div", {class: "note"}, "Prompts are not stored in the run; print this one, exactly as the model read it (no LLM is loaded), with:"),
        code(cmd), q.index === null || q.index === undefined ?
          el("div", {class: "note"}, "K: the question's 0-based position in the run's selection") : null],
      kv("prompt hash", pr.hash), kv("characters", pr.chars),
      kv("tokens in / out", show(pr.tokens) + " / " + show(gen.tokens)),
      kv("seconds", typeof gen.seconds === "number" ? gen.seconds.toFixed(2) : gen.seconds)));
  }
  return el("div", {class: "body"}, parts);
}

function row(q, i) {
  const d = el("details", {class: "q " + (q.verdict === "n/a" ? "na" : q.verdict), "data-id": q.id, "data-i": i},
    el("summary", {}, el("span", {class: "mark"}, verdictMark(q.verdict)), el("span", {class: "qid"}, q.id),
       el("span", {class: "tag"}, q.category), el("span", {class: "tag kind-" + q.kind}, q.kind),
       el("span", {class: "tag cls-" + q.class}, q.class), el("span", {class: "text"}, q.question || "")));
  d.addEventListener("toggle", () => {
    if (d.open) whenParsed(() => { if (!d.dataset.built) { d.dataset.built = "1"; d.append(body(i)); } });
  });
  return d;
}

const hay = [];
function haystack(i) {  // the first search parses every details block, once
  if (hay[i] === undefined) {
    const q = detail(i), t = q.trace, g = t.gold || {};
    hay[i] = [q.id, q.question, (t.program || {}).text, (t.generation || {}).text, show(t.answer), show(g.answer),
              g.program, q.analysis ? q.analysis.reason + " " + q.analysis.detail : ""].join("\n").toLowerCase();
  }
  return hay[i];
}

const controls = {}, bar = el("div", {class: "bar"});
for (const [param, label, field] of FILTERS) {
  const counts = {};
  for (const q of Q) counts[q[field]] = (counts[q[field]] || 0) + 1;
  const values = field === "category" ? DATA.categories : field === "verdict" ? ["right", "wrong", "n/a"] :
                 field === "kind" ? DATA.kinds : DATA.classes;
  const [lab, sel] = select(param, label, values, counts);
  controls[param] = sel; bar.append(lab);
}
controls.q = el("input", {type: "search", name: "q", placeholder: "search id, question, program, answer…"});
bar.append(el("label", {}, "search", controls.q));
const count = el("span", {class: "count", id: "count"});
bar.append(count);
// Rows are built for the page on show only: a whole validation set (11,797 questions) as one
// list of elements would keep the first page from showing for seconds.
const PAGE = 200;
const pager = el("nav", {class: "pager", id: "pager"});
const list = el("main", {id: "list"});
const rows = [];
let matches = [], page = 0, extra = null;
app.append(header(), bar, pager, list);

function rowAt(i) { return rows[i] || (rows[i] = row(Q[i], i)); }

function render() {
  const pages = Math.max(1, Math.ceil(matches.length / PAGE));
  page = Math.min(Math.max(page, 0), pages - 1);
  const shown = matches.slice(page * PAGE, (page + 1) * PAGE).map(rowAt);
  if (extra !== null && !matches.includes(extra)) shown.unshift(rowAt(extra));  // opened by link, filtered out
  shown.forEach(r => { r.hidden = false; });
  list.replaceChildren(...shown);
  const total = matches.length + (extra !== null && !matches.includes(extra) ? 1 : 0);
  count.textContent = total + " of " + Q.length + " questions shown";
  pager.replaceChildren();
  if (pages > 1) {
    const go = (to, label, off) => {
      const b = el("button", {type: "button", disabled: off}, label);
      b.addEventListener("click", () => { page = to; extra = null; render(); toHash(); window.scrollTo(0, 0); });
      return b;
    };
    pager.append(go(page - 1, "← previous", page === 0), " page " + (page + 1) + " of " + pages + " ",
                 go(page + 1, "next →", page === pages - 1));
  }
  document.body.dataset.ready = "1";  // a page of rows is in the document
}

function apply() {
  const want = {};
  for (const [param, , field] of FILTERS) want[field] = controls[param].value;
  const needle = controls.q.value.trim().toLowerCase();
  if (needle && document.readyState === "loading") { count.textContent = "searching…"; whenParsed(apply); return; }
  matches = [];
  Q.forEach((q, i) => {
    let ok = true;
    for (const field in want) if (want[field] && q[field] !== want[field]) { ok = false; break; }
    if (ok && needle) ok = haystack(i).includes(needle);
    if (ok) matches.push(i);
  });
  render();
}

function fromHash() {
  const p = hashParams();
  if (p.get("q") && document.readyState === "loading") { whenParsed(fromHash); return; }  // searches details
  for (const name in controls) {
    const v = p.get(name) || "";
    if (controls[name].tagName === "SELECT" && v && ![...controls[name].options].some(o => o.value === v))
      controls[name].append(el("option", {value: v}, v + " (0)"));
    controls[name].value = v;
  }
  page = (parseInt(p.get("page"), 10) || 1) - 1;
  extra = null;
  const open = p.get("open"), at = open ? Q.findIndex(q => q.id === open) : -1;
  if (at >= 0) extra = at;
  apply();
  if (at >= 0) {
    const pos = matches.indexOf(at);
    if (pos >= 0 && Math.floor(pos / PAGE) !== page) { page = Math.floor(pos / PAGE); render(); }
    const r = rowAt(at);
    r.open = true;
    const top = r.getBoundingClientRect().top;
    if (top < bar.offsetHeight || top > window.innerHeight - 40) r.scrollIntoView();
  }
}

function toHash() {
  const p = hashParams();
  for (const name in controls) { if (controls[name].value) p.set(name, controls[name].value); else p.delete(name); }
  if (page > 0) p.set("page", page + 1); else p.delete("page");
  setHash(p);
}
let typing = 0;  // search as one types, once the typing pauses (10k questions stay responsive)
for (const name in controls) controls[name].addEventListener(name === "q" ? "input" : "change", () => {
  clearTimeout(typing);
  typing = setTimeout(() => { page = 0; extra = null; apply(); toHash(); }, name === "q" ? 150 : 0);
});
window.addEventListener("hashchange", fromHash);
fromHash();
