// The exam viewer's video page: a zoomable 17-row timeline on a canvas and the selected event's frames.
// Data: the page's inline JSON (#viewer-data, written by vce/viewer/build.py). Event rows are
// [start, end, label, rank, match@0.5, match@0.95, event index, mean probability]; match is the
// position of the ground-truth event the official matching paired it with, -1 none, -2 no truth.
// Ground-truth rows carry 1/0 (matched or not) at each tIoU instead. No network, no library.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("viewer-data").textContent);
  const COLOR = { gt: "#2b8a3e", tp: "#1971c2", fp: "#f08c00", none: "#7048e8", trace: "#495057",
    band: "rgba(73,80,87,0.28)", thr: "#c92a2a", edge: "#212529", grid: "#dee2e6", sel: "#000000" };
  const LEFT = 190, RIGHT = 104, TOP = 26, ROW = 84, N = data.labels.length;  // ROW: 46 px of it the probability trace
  const canvas = document.getElementById("timeline");
  const ctx = canvas.getContext("2d");
  const panel = document.getElementById("event-panel");
  const status = document.getElementById("status");
  const tip = document.getElementById("tip");

  // 1. Events per kind and label, each an object the panel and the drawing share.
  function entries(kind, rows) {
    return rows.map((r) => ({ kind: kind, s: r[0], e: r[1], k: r[2], rank: r[3], m: [r[4], r[5]], idx: r[6],
      mean: r[7], ref: kind + "-" + r[6] + "-" + r[2] }));
  }
  const all = { pred: entries("pred", data.pred), clin: entries("clin", data.clin), gt: entries("gt", data.gt) };
  const byRef = {};
  const rows = {};
  for (const kind of ["pred", "clin", "gt"]) {
    rows[kind] = Array.from({ length: N }, () => []);
    for (const ev of all[kind]) { rows[kind][ev.k].push(ev); byRef[ev.ref] = ev; }
    for (const list of rows[kind]) list.sort((a, b) => a.s - b.s || a.rank - b.rank);
  }
  // 2. The probability trace: per bin its first time, min and max per label (255 = no valid frame).
  function bytes(b64) { const s = atob(b64); const out = new Uint8Array(s.length); for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i); return out; }
  const tr = data.trace, B = tr.t.length, lo = bytes(tr.lo), hi = bytes(tr.hi);
  let first = B ? tr.t[0] : Infinity, last = B ? tr.end : -Infinity;
  for (const list of [all.pred, all.clin, all.gt]) for (const ev of list) { first = Math.min(first, ev.s); last = Math.max(last, ev.e); }
  const full = [isFinite(first) ? first : 0, (isFinite(last) ? last : 0) + 1];
  let view = full.slice(), mode = "pred", selected = null, width = 0;

  function X(t) { return LEFT + (t - view[0]) / (view[1] - view[0]) * (width - LEFT - RIGHT); }
  function T(x) { return view[0] + (x - LEFT) / (width - LEFT - RIGHT) * (view[1] - view[0]); }
  function rowTop(k) { return TOP + k * ROW; }
  const STRIP = { gt: [4, 9], s0: [15, 7], s1: [24, 7], trace: [34, 46] };

  function colour(ev, i) {
    if (ev.m[i] === -2) return COLOR.none;
    return ev.m[i] >= 0 ? COLOR.tp : COLOR.fp;
  }
  function rect(ev, y, h, fill) {
    const x0 = X(ev.s), x1 = X(ev.e + 1);
    if (x1 < LEFT || x0 > width - RIGHT) return;
    const a = Math.max(x0, LEFT), b = Math.min(x1, width - RIGHT);
    ctx.fillStyle = fill;
    ctx.fillRect(a, y, Math.max(b - a, 1), h);
  }
  function ticks() {
    const span = view[1] - view[0], target = (width - LEFT - RIGHT) / 110;
    const raw = span / Math.max(target, 1), mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || mag * 10;
    const out = [];
    for (let t = Math.ceil(view[0] / step) * step; t < view[1]; t += step) out.push(t);
    return out;
  }

  // 3. Drawing: ground truth, then the events at each tIoU (false first, true on top), then the trace.
  function draw() {
    const dpr = window.devicePixelRatio || 1;
    width = canvas.clientWidth;
    const height = TOP + N * ROW + 6;
    canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr);
    canvas.style.height = height + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "12px system-ui, sans-serif"; ctx.textBaseline = "middle";
    ctx.strokeStyle = COLOR.grid; ctx.fillStyle = "#495057"; ctx.lineWidth = 1;
    for (const t of ticks()) {
      const x = Math.round(X(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, TOP - 4); ctx.lineTo(x, TOP + N * ROW); ctx.stroke();
      ctx.textAlign = "center"; ctx.fillText(String(t), x, TOP - 13);
    }
    ctx.textAlign = "left";
    ctx.fillText(data.unit === "frame" ? "t = file frame number" : "t = CSV index", 4, TOP - 13);
    for (let k = 0; k < N; k++) drawRow(k);
  }
  function drawRow(k) {
    const y = rowTop(k), events = rows[mode][k], hasGt = data.hasGt;
    if (k % 2) { ctx.fillStyle = "#f8f9fa"; ctx.fillRect(0, y, width, ROW); }
    ctx.strokeStyle = COLOR.grid; ctx.beginPath(); ctx.moveTo(0, y + 0.5); ctx.lineTo(width, y + 0.5); ctx.stroke();
    ctx.textAlign = "left"; ctx.fillStyle = "#212529"; ctx.font = (events.length ? "600 " : "") + "12px system-ui, sans-serif";
    ctx.fillText(data.labels[k], 6, y + 16);
    ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#868e96";
    const thr = data.thresholds[k];
    const count = events.length === 1 ? "1 event" : events.length + " events";
    ctx.fillText((events.length ? count : "silent") + (thr === null ? "" : " · thr " + thr.toFixed(2)), 6, y + 33);
    if (hasGt) for (const ev of rows.gt[k]) rect(ev, y + STRIP.gt[0], STRIP.gt[1], COLOR.gt);
    let prevEnd = null;
    ctx.fillStyle = COLOR.edge;
    for (const ev of rows.gt[k]) {  // a dark tick where one fragment touches the next
      if (prevEnd !== null && ev.s === prevEnd + 1) { const x = X(ev.s); if (x >= LEFT && x <= width - RIGHT) ctx.fillRect(x - 0.5, y + 2, 1.5, 13); }
      prevEnd = ev.e;
    }
    for (let i = 0; i < 2; i++) {
      const strip = STRIP["s" + i];
      const order = events.slice().sort((a, b) => (a.m[i] >= 0) - (b.m[i] >= 0) || b.rank - a.rank);
      for (const ev of order) rect(ev, y + strip[0], strip[1], colour(ev, i));
      if (!hasGt) break;
    }
    ctx.strokeStyle = COLOR.grid; ctx.fillStyle = "#868e96"; ctx.font = "10px system-ui, sans-serif"; ctx.textAlign = "right";
    for (const q of [0, 0.5, 1]) {  // the trace's scale: probability 0, 0.5 and 1
      const gy = y + STRIP.trace[0] + STRIP.trace[1] * (1 - q);
      ctx.beginPath(); ctx.moveTo(LEFT, gy); ctx.lineTo(width - RIGHT, gy); ctx.stroke();
      ctx.fillText(String(q), LEFT - 4, gy + 3);
    }
    drawTrace(k, y + STRIP.trace[0], STRIP.trace[1]);
    if (thr !== null && thr <= 1) {
      const ty = y + STRIP.trace[0] + STRIP.trace[1] * (1 - thr);
      ctx.strokeStyle = COLOR.thr; ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(LEFT, ty); ctx.lineTo(width - RIGHT, ty); ctx.stroke(); ctx.setLineDash([]);
    }
    if (selected && selected.k === k && (selected.kind === "gt" || selected.kind === mode)) {
      const strip = selected.kind === "gt" ? STRIP.gt : STRIP.s0;
      const h = selected.kind === "gt" ? strip[1] : (hasGt ? STRIP.s1[0] + STRIP.s1[1] - strip[0] : strip[1]);
      const x0 = Math.max(X(selected.s), LEFT) - 2, x1 = Math.min(X(selected.e + 1), width - RIGHT) + 2;
      ctx.strokeStyle = COLOR.sel; ctx.lineWidth = 2;
      ctx.strokeRect(x0, y + strip[0] - 2, Math.max(x1 - x0, 3), h + 4); ctx.lineWidth = 1;
    }
    ctx.textAlign = "right"; ctx.fillStyle = "#495057"; ctx.font = "11px system-ui, sans-serif";
    if (data.ap) ctx.fillText("tAP " + data.ap[k][0].toFixed(2) + " / " + data.ap[k][1].toFixed(2), width - 6, y + 16);
    if (hasGt) ctx.fillText(rows.gt[k].length + " GT · " + rows.pred[k].length + " ev", width - 6, y + 33);
  }
  function drawTrace(k, y, h) {
    if (!B) return;
    let a = 0, b = B;  // the bins in view
    while (a < B - 1 && tr.t[a + 1] <= view[0]) a++;
    while (b > a + 1 && tr.t[b - 1] >= view[1]) b--;
    const xs = (i) => X(((i + 1 < B ? tr.t[i + 1] : tr.end + 1) + tr.t[i]) / 2);
    const yv = (q) => y + h * (1 - q / 254);
    let run = [];
    const flush = () => {
      if (!run.length) return;
      ctx.beginPath();
      run.forEach((i, j) => (j ? ctx.lineTo(xs(i), yv(hi[k * B + i])) : ctx.moveTo(xs(i), yv(hi[k * B + i]))));
      for (let j = run.length - 1; j >= 0; j--) ctx.lineTo(xs(run[j]), yv(lo[k * B + run[j]]));
      ctx.closePath(); ctx.fillStyle = COLOR.band; ctx.fill();
      ctx.strokeStyle = COLOR.trace; ctx.lineWidth = 0.8; ctx.stroke(); ctx.lineWidth = 1;
      run = [];
    };
    ctx.save(); ctx.beginPath(); ctx.rect(LEFT, y - 1, width - LEFT - RIGHT, h + 2); ctx.clip();
    for (let i = a; i < b; i++) { if (hi[k * B + i] === 255) flush(); else run.push(i); }
    flush();
    ctx.restore();
  }

  // 4. Selecting: what is under the pointer, the panel with the event's frames.
  function hit(x, y) {
    const k = Math.floor((y - TOP) / ROW);
    if (k < 0 || k >= N || x < LEFT || x > width - RIGHT) return null;
    const dy = y - rowTop(k), tol = (view[1] - view[0]) / (width - LEFT - RIGHT) * 3, t = T(x);
    let kind = null;
    if (dy < STRIP.s0[0] - 1) kind = "gt";
    else if (dy < STRIP.trace[0] - 1) kind = mode;
    if (!kind) return { k: k, t: t, list: [] };
    const i = dy >= STRIP.s1[0] - 1 && data.hasGt ? 1 : 0;
    const list = rows[kind][k].filter((ev) => ev.s - tol <= t && t <= ev.e + 1 + tol);
    list.sort((a, b) => (b.m[i] >= 0) - (a.m[i] >= 0) || a.rank - b.rank);
    return { k: k, t: t, list: list };
  }
  function fmt(p) { return p === null || p === undefined ? "–" : p.toFixed(2); }
  function matchText(ev, i) {
    const thr = ["0.5", "0.95"][i];
    if (ev.kind === "gt") return ev.m[i] ? "matched at tIoU " + thr : "missed at tIoU " + thr;
    if (ev.m[i] === -2) return "no ground truth";
    if (ev.m[i] < 0) return '<span class="fp">FP</span> at tIoU ' + thr;
    const g = rows.gt[ev.k].find((x) => x.rank === ev.m[i]);
    if (!g) return '<span class="tp">TP</span> at tIoU ' + thr;
    const inter = Math.max(0, Math.min(ev.e, g.e) - Math.max(ev.s, g.s) + 1);
    const iou = inter / ((ev.e - ev.s + 1) + (g.e - g.s + 1) - inter);
    return '<span class="tp">TP</span> at tIoU ' + thr + ": GT " + g.s + "–" + g.e + " (tIoU " + iou.toFixed(3) + ")";
  }
  function select(ev, others) {
    selected = ev;
    if (!ev) { panel.innerHTML = '<p class="hint">Select an event on the timeline or in the clinical list.</p>'; draw(); return; }
    if (ev.kind !== "gt" && ev.kind !== mode) setMode(ev.kind);
    if (X(ev.e + 1) < LEFT || X(ev.s) > width - RIGHT) zoomTo(ev);
    history.replaceState(null, "", "#" + ev.ref);
    const label = data.labels[ev.k], thr = data.thresholds[ev.k];
    const what = { pred: "submission event, rank " + (ev.rank + 1) + " of " + rows.pred[ev.k].length,
      clin: "clinical event " + (ev.rank + 1) + " of " + rows.clin[ev.k].length,
      gt: "ground-truth event " + (ev.rank + 1) + " of " + rows.gt[ev.k].length }[ev.kind];
    const granted = ev.ref in data.thumbsOf, ids = data.thumbsOf[ev.ref] || [];
    const figs = ids.map((id, j) => {
      const [t, file, probs] = data.thumbs[id], p = probs[ev.k];
      const over = thr !== null && p !== null && p >= thr;
      const where = j === 0 ? " start" : j === ids.length - 1 ? " end" : "";
      return '<figure><img src="' + file + '" alt="frame ' + t + '"><figcaption><span>t ' + t + where + "</span>" +
        '<span class="bar"><span style="width:' + Math.round(100 * (p || 0)) + '%" class="' + (over ? "over" : "") +
        '"></span></span><b>p ' + fmt(p) + "</b></figcaption></figure>";
    }).join("");
    const more = (others || []).filter((o) => o !== ev).slice(0, 12).map((o) =>
      '<button type="button" data-ref="' + o.ref + '">' + o.s + "–" + o.e + (o.kind === "gt" ? "" : " #" + (o.rank + 1)) + "</button>").join(" ");
    panel.innerHTML = '<div class="event-head"><h2>' + label + ' <small>' + what + "</small></h2>" +
      '<button type="button" id="zoom-event">zoom to event</button></div>' +
      '<p class="facts">t ' + ev.s + "–" + ev.e + " (" + (ev.e - ev.s + 1) + " frames) · mean p(" + label + ") " + fmt(ev.mean) +
      (thr === null ? "" : " · threshold " + thr.toFixed(2)) + " · " + matchText(ev, 0) + " · " + matchText(ev, 1) + "</p>" +
      (figs ? '<div class="thumbs">' + figs + "</div>" : '<p class="nothumb">' + (granted
        ? "No thumbnails for this event: its frame files were not found or unreadable where this viewer was written."
        : "No thumbnails for this event (past the cap).") + "</p>") +
      '<p class="decision">' + label + ": " + data.decisions[ev.k] + "</p>" +
      (more ? '<p class="others">Also here: ' + more + "</p>" : "");
    document.getElementById("zoom-event").onclick = () => zoomTo(ev);
    panel.querySelectorAll("button[data-ref]").forEach((b) => { b.onclick = () => select(byRef[b.dataset.ref], others); });
    draw();
  }
  function zoomTo(ev) {
    const pad = Math.max(10, (ev.e - ev.s + 1) * 2);
    view = [Math.max(full[0], ev.s - pad), Math.min(full[1], ev.e + 1 + pad)];
    draw();
  }
  function setMode(m) {
    mode = m;
    document.querySelectorAll('input[name="events"]').forEach((r) => { r.checked = r.value === m; });
    draw();
  }
  function zoom(factor, at) {
    const span = Math.min(full[1] - full[0], Math.max(10, (view[1] - view[0]) * factor));
    let a = at - (at - view[0]) * span / (view[1] - view[0]);
    a = Math.min(Math.max(a, full[0]), full[1] - span);
    view = [a, a + span];
    draw();
  }

  // 5. Input: wheel zoom, drag pan, click select, arrows step through the row, the hash selects.
  let drag = null;
  canvas.addEventListener("wheel", (e) => { e.preventDefault(); zoom(e.deltaY > 0 ? 1.25 : 0.8, T(e.offsetX)); }, { passive: false });
  canvas.addEventListener("mousedown", (e) => { drag = { x: e.offsetX, view: view.slice(), moved: false }; });
  window.addEventListener("mouseup", (e) => {
    if (drag && !drag.moved && e.target === canvas) {
      const h = hit(e.offsetX, e.offsetY);
      if (h && h.list.length) select(h.list[0], h.list);
    }
    drag = null;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("mousemove", (e) => {
    if (drag && Math.abs(e.offsetX - drag.x) > 3) {
      drag.moved = true;
      const dt = (e.offsetX - drag.x) / (width - LEFT - RIGHT) * (drag.view[1] - drag.view[0]);
      const span = drag.view[1] - drag.view[0];
      const a = Math.min(Math.max(drag.view[0] - dt, full[0]), full[1] - span);
      view = [a, a + span]; draw(); return;
    }
    const h = hit(e.offsetX, e.offsetY);
    if (!h) { status.textContent = ""; tip.hidden = true; return; }
    let text = data.labels[h.k] + " · t " + Math.floor(h.t);
    if (B) {
      let i = 0; while (i < B - 1 && tr.t[i + 1] <= h.t) i++;
      const q = [lo[h.k * B + i], hi[h.k * B + i]];
      if (q[1] !== 255) text += " · p " + (q[0] === q[1] ? fmt(q[0] / 254) : fmt(q[0] / 254) + "–" + fmt(q[1] / 254));
    }
    if (h.list.length) text += " · " + h.list.length + " event(s) here: click to see the frames";
    status.textContent = text;
    tip.textContent = text;  // the value beside the pointer: the status line is below the 17 rows
    tip.style.left = (e.pageX + 14) + "px"; tip.style.top = (e.pageY + 14) + "px"; tip.hidden = false;
  });
  document.addEventListener("keydown", (e) => {
    if (!selected || (e.key !== "ArrowLeft" && e.key !== "ArrowRight") || e.target.tagName === "INPUT") return;
    const list = rows[selected.kind][selected.k], i = list.indexOf(selected) + (e.key === "ArrowRight" ? 1 : -1);
    if (i >= 0 && i < list.length) { e.preventDefault(); select(list[i]); zoomTo(list[i]); }
  });
  document.getElementById("zoom-in").onclick = () => zoom(0.5, (view[0] + view[1]) / 2);
  document.getElementById("zoom-out").onclick = () => zoom(2, (view[0] + view[1]) / 2);
  document.getElementById("zoom-reset").onclick = () => { view = full.slice(); draw(); };
  document.querySelectorAll('input[name="events"]').forEach((r) => { r.onchange = () => setMode(r.value); });
  document.querySelectorAll("[data-ref].pick").forEach((row) => {
    row.addEventListener("click", () => { select(byRef[row.dataset.ref]); canvas.scrollIntoView({ block: "nearest" }); });
  });
  document.getElementById("legend").innerHTML = data.hasGt
    ? '<i style="background:' + COLOR.gt + '"></i>ground truth <i style="background:' + COLOR.tp + '"></i>TP ' +
      '<i style="background:' + COLOR.fp + '"></i>FP (strips: tIoU 0.5, then 0.95) <i class="line"></i>probability (min–max) ' +
      '<i class="dash"></i>threshold'
    : '<i style="background:' + COLOR.none + '"></i>event (no ground truth) <i class="line"></i>probability <i class="dash"></i>threshold';
  // For bench/viewer_browser.py: where an event is drawn (page coordinates of the canvas), to click it.
  window.vceViewer = { locate: (ref) => {
    const ev = byRef[ref];
    if (ev.kind !== "gt" && ev.kind !== mode) setMode(ev.kind);
    const top = canvas.getBoundingClientRect().top + rowTop(ev.k);
    if (top < 0 || top > window.innerHeight - ROW) window.scrollBy(0, top - window.innerHeight / 3);
    const box = canvas.getBoundingClientRect(), strip = ev.kind === "gt" ? STRIP.gt : STRIP.s0;
    const x = (Math.max(X(ev.s), LEFT) + Math.min(X(ev.e + 1), width - RIGHT)) / 2;
    return { x: box.left + x, y: box.top + rowTop(ev.k) + strip[0] + strip[1] / 2 };
  } };
  window.addEventListener("resize", draw);
  draw();
  if (location.hash && byRef[location.hash.slice(1)]) { const ev = byRef[location.hash.slice(1)]; select(ev); zoomTo(ev); }
})();
