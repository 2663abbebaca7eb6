// Live refresh of the queue tables and the throughput chart. The pages are
// complete without it: the server renders every figure.
"use strict";

const REFRESH_MS = 2000;

function drawChart(canvas, series) {
  // Drawn at the size the page shows it (a phone shrinks the box), so
  // that the scale's text stays readable and the line sharp.
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height, pad = 4;
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(h * ratio);
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, w, h);
  const top = Math.max(1, ...series);
  ctx.fillStyle = "#5b6672";
  ctx.font = "11px sans-serif";
  // The top of the scale: the line's jobs per second, not the table's
  // average over the last minute.
  ctx.fillText(top.toFixed(1) + " completed/s", pad, 12);
  if (series.length < 2) return;
  ctx.strokeStyle = "#2457c5";
  ctx.lineWidth = 2;
  ctx.beginPath();
  series.forEach((v, i) => {
    const x = pad + (i * (w - 2 * pad)) / (series.length - 1);
    const y = h - pad - (v / top) * (h - 2 * pad - 14);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

function setCell(row, field, text) {
  const cell = row.querySelector(`[data-field="${field}"]`);
  if (!cell) return;
  const target = cell.querySelector("a") || cell;
  if (field === "state") {
    cell.replaceChildren();
    const span = document.createElement("span");
    span.className = text === "paused" ? "status s-paused" : "";
    span.textContent = text;
    cell.append(span);
  } else {
    target.textContent = text;
  }
}

async function refresh(chart, canvas) {
  const answer = await fetch(chart.dataset.live, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!answer.ok) return;
  const { queues, summary, chart_note: note } = await answer.json();
  for (const [field, text] of Object.entries(summary || {})) {
    const cell = document.querySelector(`[data-summary="${field}"]`);
    if (cell) (cell.querySelector("a") || cell).textContent = text;
  }
  // The chart sums the queues' series, aligned on their latest samples.
  const length = Math.max(0, ...queues.map((q) => q.series.length));
  const total = Array(length).fill(0);
  for (const q of queues) {
    const offset = length - q.series.length;
    q.series.forEach((v, i) => { total[offset + i] += v; });
    const row = document.querySelector(`tr[data-queue="${CSS.escape(q.queue)}"]`);
    if (!row) continue;
    for (const [status, n] of Object.entries(q.counts)) setCell(row, status, String(n));
    setCell(row, "oldest_ready", q.oldest_ready);
    setCell(row, "held_concurrency", q.held_concurrency);
    setCell(row, "held_rate_limit", q.held_rate_limit);
    setCell(row, "next_available", q.next_available);
    setCell(row, "rate", q.rate);
    setCell(row, "state", q.paused ? "paused" : "active");
  }
  // Words instead of a flat line when nothing completed.
  const words = chart.querySelector(".chart-note");
  words.textContent = note || "";
  words.hidden = !note;
  canvas.hidden = Boolean(note);
  if (!note) drawChart(canvas, total);
}

document.addEventListener("DOMContentLoaded", () => {
  document.documentElement.classList.add("js");
  const chart = document.querySelector("[data-live]");
  if (!chart) return;
  const canvas = chart.querySelector("canvas");
  const tick = () => refresh(chart, canvas).catch(() => {}).finally(() => setTimeout(tick, REFRESH_MS));
  tick();
});
