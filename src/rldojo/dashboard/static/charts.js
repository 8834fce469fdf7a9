// Per-step charts of a run page (Plotly, served from this server). Each chart: the metric
// keys it plots, matched by pattern; several runs are overlaid, one trace per run and key.
"use strict";
const CHARTS = [
  {title: "Reward", keys: [/^reward\/mean$/, /^reward\/std$/]},
  {title: "Pass rate per env", keys: [/^reward\/pass_rate$/, /^reward\/[^/]+\/pass_rate$/]},
  {title: "Reward per env", keys: [/^reward\/(?!component\/)[^/]+\/mean$/]},
  {title: "Held-out accuracy (95% CI)", evals: true},
  {title: "Completion length (tokens)", keys: [/^rollout\/completion_len$/]},
  {title: "Entropy (nats)", keys: [/^entropy\/p(50|80|95)$/]},
  {title: "Share of tokens below 0.01 nats", keys: [/^entropy\/frac_below_0\.01$/]},
  {title: "Mask: entropy threshold", keys: [/^entropy\/threshold$/]},
  {title: "Mask: tokens selected / policy tokens", keys: [/^entropy\/tokens_(selected|policy)$/]},
  {title: "Clip fractions", keys: [/^loss\/(dual_)?clip_frac(_low|_high)?$/]},
  {title: "Grad norm", keys: [/^optim\/grad_norm$/]},
  {title: "KL", keys: [/^loss\/kl$/]},
  {title: "Time per phase (s)", keys: [/^time\/(generate|grade|train|step|wait_rollouts)$/]},
  {title: "Generation tokens/s", keys: [/^time\/tokens_per_s_generate$/]},
  {title: "Failures by status", keys: [/^rollout\/status_(?!ok$).+$/, /^rollout\/stale_dropped$/]},
];

function chartKeys(runs) {
  const keys = new Set();
  runs.forEach(d => d.train.forEach(r => Object.keys(r).forEach(k => {
    if (CHARTS.some(c => c.keys && c.keys.some(p => p.test(k)))) keys.add(k);
  })));
  return [...keys];
}

function tracesFor(chart, runs) {
  const traces = [];
  const many = runs.length > 1;
  for (const d of runs) {
    const name = key => (many ? d.row.id + " · " : "") + key;
    if (chart.evals) {
      const ev = d.evals.filter(e => typeof e["eval/accuracy"] === "number");
      if (!ev.length) continue;
      const hasCI = ev.every(e => typeof e["eval/ci_low"] === "number");
      traces.push({x: ev.map(e => e.step), y: ev.map(e => e["eval/accuracy"]), name: name("eval/accuracy"),
        mode: "lines+markers", type: "scatter",
        error_y: hasCI ? {type: "data", symmetric: false,
          array: ev.map(e => e["eval/ci_high"] - e["eval/accuracy"]),
          arrayminus: ev.map(e => e["eval/accuracy"] - e["eval/ci_low"])} : undefined});
      continue;
    }
    const keys = new Set();
    d.train.forEach(r => Object.keys(r).forEach(k => { if (chart.keys.some(p => p.test(k))) keys.add(k); }));
    for (const k of [...keys].sort()) {
      const pts = d.train.filter(r => typeof r[k] === "number");
      traces.push({x: pts.map(r => r.step), y: pts.map(r => r[k]), name: name(k), mode: "lines+markers", type: "scatter"});
    }
  }
  return traces;
}

function drawCharts(el, runs, extraKey) {
  const charts = CHARTS.slice();
  if (extraKey) charts.push({title: extraKey, keys: [new RegExp("^" + extraKey.replace(/[.*+?^${}()|[\]\\\/]/g, "\\$&") + "$")]});
  const wanted = charts.map(c => ({chart: c, traces: tracesFor(c, runs)})).filter(x => x.traces.length);
  const ids = wanted.map((_, i) => "chart-" + i);
  if (el.children.length !== wanted.length || [...el.children].some((c, i) => c.dataset.title !== wanted[i].chart.title)) {
    el.innerHTML = wanted.map((w, i) => `<div class="chart" id="${ids[i]}" data-title="${esc(w.chart.title)}"></div>`).join("");
  }
  if (!wanted.length) el.innerHTML = '<p class="muted" data-empty>no steps logged yet</p>';
  wanted.forEach((w, i) => Plotly.react(ids[i], w.traces, {
    title: {text: w.chart.title, font: {size: 13}}, margin: {l: 48, r: 10, t: 34, b: 32},
    xaxis: {title: {text: "step"}}, legend: {orientation: "h", y: -0.25, font: {size: 10}}, showlegend: w.traces.length > 1,
  }, {displaylogo: false, responsive: true}));
}
