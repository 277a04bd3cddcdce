"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
// Every string reaches the page as a text node: el() never parses markup.
function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v; else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}
function show(value) {
  if (value === null || value === undefined) return "—";
  if (Array.isArray(value)) return value.length ? value.map(show).join(", ") : "(empty)";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}
function pct(x) { return typeof x === "number" ? (100 * x).toFixed(2) + "%" : "—"; }
function kv(key, value, cls) { return el("div", {class: "kv"}, el("b", {}, key), el("span", {class: cls}, show(value))); }
function code(text, empty) {
  return text === null || text === undefined || text === "" ? el("div", {class: "note"}, empty || "none") : el("pre", {}, text);
}
function select(name, label, values, counts) {
  const s = el("select", {name: name}, el("option", {value: ""}, "all"));
  for (const v of values) if (!counts || counts[v]) s.append(el("option", {value: v}, counts ? v + " (" + counts[v] + ")" : v));
  return [el("label", {}, label, s), s];
}
function hashParams() { return new URLSearchParams(location.hash.replace(/^#/, "")); }
function setHash(params) {
  const text = params.toString();
  try { history.replaceState(null, "", text ? "#" + text : location.pathname + location.search); } catch (e) { /* file:// quirks */ }
}
function score(x) { return typeof x === "number" ? x.toFixed(3) : null; }
function triples(items, what) {  // retrieved knowledge triples, each with its score when it has one
  if (!items || !items.length) return el("div", {class: "note"}, "no " + what);
  return el("ol", {class: "triples"}, items.map(t => el("li", {}, typeof t === "string" ? t : [t.text,
    score(t.score) ? el("span", {class: "score"}, " " + score(t.score)) : null])));
}
function steps(list, id) {  // each executed step: its call, the steps it reads, what its result holds
  if (!list) return el("div", {class: "note", id: id}, "no program ran");
  if (!list.length) return el("div", {class: "note", id: id}, "no step ran");
  return el("ol", {class: "steps", id: id}, list.map(s => {
    const single = s.holds === "a count" || s.holds === "yes/no" || s.holds === "a name";
    const more = s.count > s.first.length ? ", …" : "";
    return el("li", {value: s.step}, el("code", {}, s.function + "[" + s.args.join(" | ") + "]"),
      s.inputs.length ? el("span", {class: "score"}, " ← " + s.inputs.join(", ")) : null, " ⇒ ",
      single ? [s.holds, ": ", el("b", {}, s.first.join(", "))]
             : [s.holds + " (" + s.count + "): ", s.count ? s.first.join(", ") + more : "empty"]);
  }));
}
function verdictMark(v) { return v === "right" ? "✓" : v === "wrong" ? "✗" : "·"; }
