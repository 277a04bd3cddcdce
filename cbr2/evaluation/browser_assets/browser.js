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

function triples(ids, what) {
  const S = block(0).strings;
  if (!ids || !ids.length) return el("div", {class: "note"}, "no " + what);
  return el("ol", {class: "triples"}, ids.map(i => el("li", {}, S[i])));
}

function caseBlock(hit, rank) {
  const [cid, views, scores, own] = hit, c = block(0).cases[cid] || {}, k = own || c;
  const found = views.map((v, i) => v + (typeof scores[i] === "number" ? " " + scores[i].toFixed(3) : "")).join(", ");
  const d = el("details", {class: "case"},
    el("summary", {}, rank + 1 + ". ", el("span", {class: "qid"}, cid), " ", el("span", {class: "score"}, found), " ",
       c.question || ""));
  d.addEventListener("toggle", () => {
    if (!d.open || d.dataset.built) return;
    d.dataset.built = "1";
    d.append(code(c.program, "program not known (the benchmark could not be loaded)"),
             el("h3", {}, "its ontology triples"), triples(k.ontology, "ontology triples"),
             el("h3", {}, "its fact triples"), triples(k.facts, "fact triples"));
  });
  return d;
}

function body(i) {
  const q = detail(i), a = q.analysis, parts = [];
  parts.push(el("div", {class: "grid"},
    el("div", {}, el("h3", {}, "gold"), kv("answer", q.gold_answer), code(q.gold_program, "no gold program")),
    el("div", {}, el("h3", {}, "prediction"),
       kv("answer", q.answer, q.verdict === "right" ? "ok" : "bad"),
       q.values && q.values_n ? kv("values", q.values.length + " of " + q.values_n + " shown") : null,
       code(q.program, q.verdict === "n/a" ? "not generated" : "no program parsed"))));
  if (q.verdict !== "n/a") {
    parts.push(el("h3", {}, "verdict"),
      kv("correct", q.verdict, q.verdict === "right" ? "ok" : "bad"), kv("error kind", q.kind),
      q.error ? kv("error", q.error.message || q.error) : null,
      a ? kv("error class", a.class + " · " + a.reason) : null, a && a.detail ? kv("why", a.detail) : null);
    parts.push(el("h3", {}, "generated text"), code(q.generated, "empty"),
      q.generated_chars ? el("div", {class: "note"}, "clipped: the model wrote " + q.generated_chars + " characters") : null,
      kv("repairs", q.repairs && q.repairs.length ? q.repairs : "none"),
      kv("syntax error before / after repair", show(q.syntax_error_before_repair) + " / " + show(q.syntax_error)));
    if (q.unknown_arguments && q.unknown_arguments.length)
      parts.push(kv("arguments outside the KB", q.unknown_arguments.map(u => u.function + " " + u.arg + ": " + u.value)));
    if (q.canonicalized && q.canonicalized.length)
      parts.push(kv("canonicalised", q.canonicalized.map(c => show(c.value) + " → " + show(c.snapped))));
    if (q.fallback && q.fallback.fired) {
      const f = q.fallback, sp = q.single_pass || {};
      parts.push(el("details", {}, el("summary", {}, "fallback: the correction round (kept: " + show(f.kept) + ")"),
        el("h3", {}, "single pass"), kv("error kind", sp.error_kind), code(sp.generated, "empty"),
        el("h3", {}, "correction"), kv("error kind", f.error_kind), code(f.generated, "empty")));
    }
  }
  const r = q.retrieval;
  if (!r) {
    parts.push(el("h3", {}, "retrieval"), el("div", {class: "note"},
      DATA.has_retrieval ? "no retrieval record for this question" : "this run wrote no retrieval.jsonl (it retrieved nothing)"));
  } else {
    parts.push(el("div", {class: "grid"},
      el("div", {}, el("h3", {}, "ontology triples"), triples(r.ontology, "ontology triples")),
      el("div", {}, el("h3", {}, "fact triples"), triples(r.facts, "fact triples"))));
    parts.push(el("h3", {}, "cases (views that found them, scores)"),
      r.cases.length ? r.cases.map(caseBlock) : el("div", {class: "note"}, "no cases"));
  }
  if (q.verdict !== "n/a") {
    const cmd = DATA.prompt_command + " " + (q.index === null || q.index === undefined ? "K" : q.index);
    parts.push(el("details", {}, el("summary", {}, "prompt" + (q.prompt_tokens ? " (" + q.prompt_tokens + " tokens)" : "")),
      q.prompt ? code(q.prompt) : [el("div", {class: "note"}, "Prompts are not stored in the run; print this one, exactly as the model read it (no LLM is loaded), with:"),
        code(cmd), q.index === null || q.index === undefined ?
          el("div", {class: "note"}, "K: the question's 0-based position in the run's selection") : null],
      kv("prompt hash", q.prompt_hash),
      kv("tokens in / out", show(q.prompt_tokens) + " / " + show(q.completion_tokens)),
      kv("seconds", typeof q.latency_s === "number" ? q.latency_s.toFixed(2) : q.latency_s)));
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
    const q = detail(i);
    hay[i] = [q.id, q.question, q.program, q.generated, show(q.answer), show(q.gold_answer), q.gold_program,
              q.analysis ? q.analysis.reason + " " + q.analysis.detail : ""].join("\n").toLowerCase();
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
