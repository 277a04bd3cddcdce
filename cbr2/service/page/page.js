// The page of `cbr2 serve` (after common.js): a question in, its trace out. POST api/ask answers
// with the trace (cbr2/evaluation/trace.py, the object `cbr2 ask --json` prints); every string of
// it, and of an error, reaches the page through el(), as a text node. DATA.info is what the service
// answers with (KBQA.info()), DATA.example a question to show as an example.
const INFO = DATA.info;
const app = document.getElementById("app");
const state = s => { document.body.dataset.state = s; };

function caseItem(c, rank) {  // a solved question of the prompt: the views that found it, their scores
  const found = c.found_by.map(f => el("span", {class: "tag view-" + f.view},
    f.view + (score(f.score) ? " " + score(f.score) : "")));
  return el("details", {class: "case"},
    el("summary", {}, rank + 1 + ". ", el("span", {class: "qid"}, c.id), " ", found, " ", c.question || ""),
    code(c.program, "program not known"),
    c.ontology.length ? [el("h3", {}, "its ontology triples"), triples(c.ontology, "ontology triples")] : null,
    c.facts.length ? [el("h3", {}, "its fact triples"), triples(c.facts, "fact triples")] : null);
}

function outcome(t) {
  if (t.answered) {
    const answer = Array.isArray(t.answer) ? t.answer.join("; ") : String(t.answer);
    return el("div", {class: "outcome ok"}, el("span", {class: "label"}, "Answer"), el("span", {id: "answer"}, answer));
  }
  const e = t.error || {};
  return el("div", {class: "outcome bad", id: "error"},
    el("span", {class: "label"}, "No answer"),
    el("div", {}, el("b", {}, "failed (" + show(e.kind || t.error_kind) + ")"), e.where ? " at " + e.where : "",
       e.message ? [": ", el("span", {id: "error-message"}, e.message)] : ""));
}

function render(t) {  // the whole trace
  const p = t.program || {}, g = t.generation || {}, pr = t.prompt || {}, parts = [];
  parts.push(el("h2", {id: "asked"}, t.question), outcome(t));
  parts.push(el("div", {class: "grid"},
    el("div", {}, el("h3", {}, "program that ran" + (p.repairs && p.repairs.length ? " (after repair)" : "")),
       el("div", {id: "program"}, code(p.text, t.generation ? "none: it did not parse and type-check" : "not generated")),
       kv("repairs", p.repairs && p.repairs.length ? p.repairs : "none needed"),
       p.canonicalized && p.canonicalized.length ?
         kv("canonicalised", p.canonicalized.map(c => show(c.value) + " → " + show(c.snapped))) : null,
       p.unknown_arguments && p.unknown_arguments.length ?
         kv("arguments outside the KB", p.unknown_arguments.map(u => u.function + " " + u.arg + ": " + u.value)) : null),
    el("div", {}, el("h3", {}, "generated"), el("div", {id: "generated"}, code(g.text, "nothing")),
       g.chars ? el("div", {class: "note"}, "clipped: the model wrote " + g.chars + " characters") : null,
       kv("seconds", typeof g.seconds === "number" ? g.seconds.toFixed(2) : g.seconds),
       kv("tokens in / out", show(pr.tokens) + " / " + show(g.tokens)))));
  parts.push(el("h3", {}, "steps (each result: how many, the first ones)"), steps(t.steps, "steps"));
  if (t.fallback) {
    const f = t.fallback.correction || {}, sp = t.fallback.single_pass || {};
    parts.push(el("details", {}, el("summary", {}, "fallback: the correction round (kept: " + show(f.kept) + ")"),
      el("h3", {}, "single pass"), kv("error kind", sp.error_kind), code(sp.generated, "empty"),
      el("h3", {}, "correction"), kv("error kind", f.error_kind), code(f.generated, "empty")));
  }
  if (t.linked) {
    const values = Object.entries(t.linked.values || {}).map(([kind, vs]) => kind + ": " + vs.join(", "));
    parts.push(el("h3", {}, "linked in the question"), el("div", {id: "linked"}, kv("entities", t.linked.entities),
      kv("concepts", t.linked.concepts), kv("values", values)));
  }
  if (!t.knowledge) {
    parts.push(el("h3", {}, "retrieval"), el("div", {class: "note"}, "the configuration retrieves nothing"));
  } else {
    parts.push(el("div", {class: "grid"},
      el("div", {}, el("h3", {}, "ontology triples (scores)"), triples(t.knowledge.ontology, "ontology triples")),
      el("div", {}, el("h3", {}, "fact triples (scores)"), triples(t.knowledge.facts, "fact triples"))));
    const v = t.case_views;
    parts.push(el("h3", {}, "cases (views that found them, scores)"),
      v ? el("div", {class: "note"}, "views " + (v.used.length ? v.used.join(", ") : "none") + ": " + v.why) : null,
      el("div", {id: "cases"}, t.cases.length ? t.cases.map(caseItem) : el("div", {class: "note"}, "no cases")));
  }
  parts.push(el("details", {}, el("summary", {}, "prompt (" + show(pr.chars) + " characters" +
      (pr.tokens ? ", " + pr.tokens + " tokens" : "") + ")"),
    pr.text ? code(pr.text) : el("div", {class: "note"}, "tick “show the prompt” to see it as the model read it"),
    kv("prompt hash", pr.hash)));
  return parts;
}

// ------------------------------------------------------------------------------------------ form
const input = el("input", {type: "text", id: "question", name: "question", required: true, autofocus: true,
  maxlength: INFO.max_question_chars, placeholder: DATA.example ? "e.g. " + DATA.example : "a question about the KB"});
const prompt = el("input", {type: "checkbox", id: "show-prompt", name: "show_prompt"});
const button = el("button", {type: "submit", id: "ask"}, "Ask");
const status = el("span", {class: "status", id: "status", role: "status"});
const form = el("form", {id: "ask-form", autocomplete: "off"},
  input, button, el("label", {class: "check"}, prompt, " show the prompt"), status);
const result = el("main", {id: "result"});
const views = INFO.case_views && INFO.case_views.used.length ? INFO.case_views.used.join(" + ") : "none";
app.append(el("header", {}, el("h1", {}, "CBR² · ask a question"),
  el("p", {class: "summary", id: "info"}, INFO.benchmark + " (" + INFO.kb.entities + " entities, " + INFO.cases +
    " solved cases) · " + INFO.backend + " " + show(INFO.model) + " · cases: " + views +
    (INFO.ablation ? " · " + INFO.ablation : ""))), el("div", {class: "bar"}, form), result);

async function ask(question, showPrompt) {  // the trace, or throws an Error with the service's message
  let response;
  try {
    response = await fetch("api/ask", {method: "POST", cache: "no-store", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({question: question, show_prompt: showPrompt})});
  } catch (e) {
    throw new Error("the service did not answer (" + e.message + "); is cbr2 serve still running?");
  }
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) throw new Error((body && body.error) || "the service answered " + response.status);
  if (!body || typeof body !== "object") throw new Error("the service answered with no trace");
  return body;
}

form.addEventListener("submit", async event => {
  event.preventDefault();  // the page asks; the form itself is never sent (CSP form-action 'none')
  const question = input.value.trim();
  if (!question) { status.textContent = "write a question first"; return; }
  button.disabled = true;
  state("asking");
  const started = Date.now();
  const waiting = () => { status.textContent = "answering… " + Math.round((Date.now() - started) / 1000) + " s"; };
  waiting();
  const tick = setInterval(waiting, 1000);
  try {
    const t = await ask(question, prompt.checked);
    result.replaceChildren(...render(t));
    status.textContent = (t.answered ? "answered" : "no answer") + " in " + ((Date.now() - started) / 1000).toFixed(1) + " s";
    state(t.answered ? "answered" : "failed");
  } catch (e) {
    result.replaceChildren(el("div", {class: "outcome bad", id: "error"}, el("span", {class: "label"}, "Error"),
      el("span", {id: "error-message"}, e.message)));
    status.textContent = "";
    state("error");
  } finally {
    clearInterval(tick);
    button.disabled = false;
  }
});
state("ready");
