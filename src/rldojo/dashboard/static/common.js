// rldojo dashboard: shared helpers. Every request goes to this server (relative URLs).
"use strict";
const $ = (sel, root = document) => root.querySelector(sel);
const params = () => new URLSearchParams(location.search);

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function fmt(v, digits = 3) {
  if (v === null || v === undefined || v === "") return "–";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(digits);
  return esc(v);
}
function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%"; }
function secs(v) {
  if (v === null || v === undefined) return "–";
  return v < 90 ? v.toFixed(1) + " s" : Math.floor(v / 60) + " min " + Math.round(v % 60) + " s";
}
function badge(s) { return `<span class="badge ${esc(s)}">${esc(s)}</span>`; }
// A run's status badge and, unless the step count ended it, what did (summary.json's `stopped`).
const STOPPED_BY = {max_minutes: "run.max_minutes spent", callback: "a callback", failures: "failure budget"};
function runStatus(r) {
  const by = r.stopped_by;
  const how = by && by !== "steps" && by !== r.status ? ` <span class="muted">(${esc(STOPPED_BY[by] ?? by)})</span>` : "";
  return badge(r.status) + how;
}
function runLink(id, text) { return `<a href="run?id=${encodeURIComponent(id)}">${esc(text ?? id)}</a>`; }

async function getJSON(url) {
  const r = await fetch(url);
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) throw new Error((body && body.detail) || `${r.status} ${r.statusText}`);
  return body;
}
function showError(el, err) { el.innerHTML = `<p class="error" data-error>${esc(err.message || err)}</p>`; }

// Poll `fn` every `ms` while `keepGoing()` is true (a run that is still writing).
function poll(fn, ms, keepGoing) {
  const tick = async () => { await fn(); if (keepGoing()) setTimeout(tick, ms); };
  setTimeout(tick, ms);
}
function nav(active) {
  const run = params().get("run") || params().get("id");
  const links = [["./", "Runs"], ["reports", "Reports"]];
  if (run) links.splice(1, 0, [`run?id=${encodeURIComponent(run)}`, "Run"], [`rollouts?run=${encodeURIComponent(run)}`, "Rollouts"]);
  document.body.insertAdjacentHTML("afterbegin", `<header><span class="brand">rldojo</span>${
    links.map(([h, t]) => `<a href="${h}"${t === active ? ' style="color:#fff"' : ""}>${t}</a>`).join("")}</header>`);
}
