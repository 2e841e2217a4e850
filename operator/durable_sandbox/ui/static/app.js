// dsb ui: the runs list's live rows and the run page's timeline. No framework, no build step; the
// server renders the pages (and the rows/header fragments it sends), this file only wires them up.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "runs") runsPage();
  if (page === "run") runPage();
});

// ---------------------------------------------------------------- runs list

function runsPage() {
  const table = $("#runs");
  const live = $("#runs-live");
  if (!table || !window.EventSource) return;
  const es = new EventSource(table.dataset.stream);
  es.addEventListener("rows", (e) => {
    const d = JSON.parse(e.data);
    $("#runs-rows").innerHTML = d.html; // rendered by the server from the same template as the page
    $("#runs-total").textContent = d.total;
    $("#runs-pages").textContent = d.pages;
    live.classList.remove("off");
    live.title = "updated as runs change";
  });
  es.addEventListener("trouble", (e) => {
    live.classList.add("off");
    live.title = `live updates paused: ${JSON.parse(e.data).why}`;
  });
  es.onerror = () => live.classList.add("off");
}

// ---------------------------------------------------------------- run page: the timeline

const ROW = 24; // px per row: the list is virtualized, only the rows in view (and a margin) exist
const MAX_COLS = 12; // lane columns drawn side by side; more lanes share columns
const KIND_ORDER = ["call", "step", "branch", "parallel", "provision", "snapshot", "snapshot-delete", "loss", "lost", "destroy",
  "restore", "hibernate", "finalize", "callback", "signal", "timer", "backoff", "suspend", "resume", "run", "k8s", "patch",
  "event", "progress"];

function runPage() {
  const root = $("#timeline");
  if (!root) return;
  const tl = new TimelineView(root);
  window.dsbTimeline = tl; // for people poking at the page from the console (and the browser tests)
  tl.load();
}

class TimelineView {
  constructor(root) {
    this.root = root;
    this.ref = root.dataset.ref;
    this.list = $("#tl-list");
    this.spacer = $("#tl-spacer");
    this.detail = $("#tl-detail");
    this.canvas = $("#tl-overview");
    this.window = $("#tl-window");
    this.items = [];
    this.byKey = new Map();
    this.lanes = [];
    this.hidden = new Set();
    this.search = "";
    this.view = []; // indexes into items, after filters
    this.selected = null;
    this.colors = {};
    const style = getComputedStyle(document.documentElement);
    for (const k of KIND_ORDER) this.colors[k] = style.getPropertyValue(`--k-${k}`).trim() || "#999";
    this.list.addEventListener("scroll", () => this.render(), { passive: true });
    this.list.addEventListener("click", (e) => {
      const row = e.target.closest(".tr");
      if (row) this.select(Number(row.dataset.i));
    });
    this.list.addEventListener("keydown", (e) => this.key(e));
    this.canvas.addEventListener("click", (e) => this.jump(e));
    $("#tl-search").addEventListener("input", (e) => { this.search = e.target.value.toLowerCase(); this.refilter(); });
    $("#tl-progress").addEventListener("change", () => this.load());
    window.addEventListener("resize", () => { this.drawOverview(); this.render(true); });
  }

  url(path, extra = "") {
    const progress = $("#tl-progress").checked ? "1" : "0";
    return `${path}?id=${encodeURIComponent(this.ref)}&progress=${progress}${extra}`;
  }

  async load() {
    if (this.es) this.es.close();
    const resp = await fetch(this.url("/api/timeline"));
    const d = await resp.json();
    if (!resp.ok) { this.detail.innerHTML = `<p class="error">${esc(d.error)}</p>`; return; }
    this.gen = d.gen; this.v = d.v; this.base = d.base; this.lanes = d.lanes;
    this.status = d.status; this.terminal = d.terminal; this.live = d.live ?? !d.terminal;
    this.items = d.items;
    this.omitted = d.omitted || 0; // a Sandbox's long session: the oldest items are not sent
    this.byKey = new Map(this.items.map((it) => [it.k, it]));
    this.refilter();
    if ($("#tl-follow").checked && !this.terminal) this.list.scrollTop = this.list.scrollHeight;
    this.follow();
  }

  follow() {
    if (!window.EventSource) return;
    this.es = new EventSource(this.url("/api/timeline/stream", `&gen=${this.gen}&v=${this.v}`));
    this.es.addEventListener("delta", (e) => this.apply(JSON.parse(e.data)));
    this.es.addEventListener("reset", () => { this.es.close(); this.load(); });
    this.es.addEventListener("gone", (e) => {
      this.es.close();
      this.notice(`This run no longer exists: ${JSON.parse(e.data).why}`);
    });
    this.es.addEventListener("trouble", (e) => this.notice(`Live updates paused (retrying): ${JSON.parse(e.data).why}`));
  }

  // A line above the timeline saying why it is not live (cleared by the next update).
  notice(text) {
    let el = $("#tl-notice");
    if (!el) {
      el = h("p", { id: "tl-notice", class: "flash bad" });
      this.root.prepend(el);
    }
    el.textContent = text;
  }

  apply(d) {
    $("#tl-notice")?.remove();
    if (d.header) replaceHeader(d.header);
    if (d.status) { this.status = d.status; this.terminal = d.terminal; this.live = d.live ?? !d.terminal; }
    if (d.lanes) this.lanes = d.lanes;
    if (d.omitted != null) this.omitted = d.omitted;
    let added = false;
    for (const it of d.items || []) {
      const known = this.byKey.get(it.k);
      if (known) Object.assign(known, it);
      else { this.items.push(it); added = true; }
      this.byKey.set(it.k, known || it);
    }
    if (added) this.items.sort(order);
    const atEnd = this.list.scrollTop + this.list.clientHeight >= this.list.scrollHeight - ROW * 2;
    this.refilter();
    if (added && atEnd && $("#tl-follow").checked) this.list.scrollTop = this.list.scrollHeight;
    if (this.selected && d.items && d.items.some((it) => it.k === this.selected)) this.showRecord(this.selected);
  }

  refilter() {
    const q = this.search;
    this.view = [];
    const counts = {};
    for (let i = 0; i < this.items.length; i++) {
      const it = this.items[i];
      counts[it.c] = (counts[it.c] || 0) + 1;
      if (this.hidden.has(it.c)) continue;
      if (q && !(it.l.toLowerCase().includes(q) || opOf(it).toLowerCase().includes(q) || it.c.includes(q)
                 || (it.id && it.id.toLowerCase().includes(q)))) continue;
      this.view.push(i);
    }
    this.layout();
    this.kinds(counts);
    $("#tl-count").textContent = `${this.view.length} of ${this.items.length} shown` +
      (this.omitted ? `; ${this.omitted} older not loaded (dsb --kube history ${this.ref} prints them)` : "");
    this.spacer.style.height = `${this.view.length * ROW}px`;
    this.drawOverview();
    this.render(true);
  }

  // Lanes (parallel branches) get columns side by side: lanes whose operations overlap in time never
  // share a column (beyond MAX_COLS they must); a lane's rail runs from its first row to its last.
  layout() {
    const span = new Map(); // lane -> [first row, last row, start ms, end ms]
    this.view.forEach((idx, row) => {
      const it = this.items[idx];
      const end = it.t1 ?? it.t0;
      const s = span.get(it.n);
      if (!s) span.set(it.n, [row, row, it.t0, end]);
      else { s[1] = row; s[3] = Math.max(s[3], end); }
    });
    const lanes = [...span.keys()].sort((a, b) => span.get(a)[2] - span.get(b)[2] || a - b);
    const busyUntil = [-Infinity]; // per column: the end time of its last lane
    this.col = new Map();
    this.spans = [];
    for (const n of lanes) {
      const [first, last, start, end] = span.get(n);
      let c = 0;
      if (n !== 0) {
        c = busyUntil.findIndex((until, i) => i > 0 && until < start);
        if (c < 0) c = busyUntil.length < MAX_COLS ? busyUntil.length : 1 + (n % (MAX_COLS - 1));
        busyUntil[c] = Math.max(busyUntil[c] ?? -Infinity, end);
      }
      this.col.set(n, c);
      this.spans.push([c, first, last]);
    }
    this.cols = busyUntil.length;
    this.list.style.setProperty("--gutter", `${this.cols * 10 + 4}px`);
    let end = 0;
    for (const it of this.items) end = Math.max(end, it.t1 ?? it.t0, it.t0);
    this.lastSeen = end; // a stopped run's last sign of life: what it left in flight ends there
    if (this.grows()) end = Math.max(end, Date.now() - this.base * 1000);
    this.tmax = Math.max(end, 1);
    this.axis();
  }

  axis() {
    const el = $("#tl-axis");
    el.replaceChildren();
    for (let i = 0; i <= 5; i++) el.append(h("span", { style: { left: `${i * 20}%` }, text: `+${fmtMs((this.tmax * i) / 5)}` }));
  }

  kinds(counts) {
    const el = $("#tl-kinds");
    el.replaceChildren();
    for (const k of KIND_ORDER.filter((kind) => counts[kind])) {
      const b = h("button", { type: "button", class: this.hidden.has(k) ? "off" : "", title: `show or hide ${k}`, data: { kind: k } },
        h("i", { style: { background: this.colors[k] } }), `${k} ${counts[k]}`);
      b.addEventListener("click", () => {
        if (this.hidden.has(k)) this.hidden.delete(k); else this.hidden.add(k);
        this.refilter();
      });
      el.append(b);
    }
  }

  // Only the rows in view (and a margin) exist; scrolling adds the rows that come into view and removes
  // those that leave, so a frame costs the same for a run of 20 operations or of 10,000.
  render(force = false) {
    // Layout is read once, before the rows change: reading it after would force a layout every frame.
    const top = this.list.scrollTop;
    const height = this.list.clientHeight;
    this.shown = [Math.floor(top / ROW), Math.min(Math.ceil((top + height) / ROW), this.view.length) - 1];
    const from = Math.max(0, Math.floor(top / ROW) - 10);
    const to = Math.min(this.view.length, Math.ceil((top + height) / ROW) + 10);
    if (force || !this.nodes) {
      this.nodes = new Map();
      this.spacer.replaceChildren();
    } else if (from === this.from && to === this.to) return;
    this.from = from; this.to = to;
    for (const [row, node] of this.nodes) {
      if (row < from || row >= to) { node.remove(); this.nodes.delete(row); }
    }
    const added = [];
    for (let row = from; row < to; row++) {
      if (!this.nodes.has(row)) { const node = this.rowNode(row); this.nodes.set(row, node); added.push(node); }
    }
    if (added.length) this.spacer.append(...added);
    this.drawWindow();
  }

  // Whether what is open grows until now: while the run executes, or waits (its callback's bar), not once stopped.
  grows() {
    return !this.terminal && (this.live || this.status === "waiting");
  }

  // Where an item's bar ends: its end; open, now while the run goes on, else the run's last sign of life.
  endOf(it, now) {
    if (it.t1 != null) return it.t1;
    if (it.r !== 0 || this.terminal) return it.t0;
    if (this.live || (it.o === "waiting" && this.status === "waiting")) return Math.max(it.t0, now);
    return Math.max(it.t0, this.lastSeen ?? it.t0);
  }

  // Built with DOM calls, not HTML strings: the page's Content-Security-Policy allows no inline styles.
  rowNode(row) {
    const idx = this.view[row];
    const it = this.items[idx];
    let outcome = it.o;
    if ((outcome === "running" && !this.live) || (this.terminal && outcome === "waiting")) outcome = "unfinished";
    const mine = this.col.get(it.n) ?? 0;
    const gutter = h("span", { class: "tg" });
    for (const [c, a, b] of this.spans) if (a <= row && row <= b && c !== mine) gutter.append(h("b", { style: { left: `${c * 10 + 4}px` } }));
    gutter.append(h("b", { style: { left: `${mine * 10 + 4}px` } }), h("b", { class: "dot", style: { left: `${mine * 10 + 4}px` } }));
    // An operation not finished yet runs until now while the run does; events are instants.
    const t1 = this.endOf(it, Date.now() - this.base * 1000);
    const left = (it.t0 / this.tmax) * 100, width = Math.max(((t1 - it.t0) / this.tmax) * 100, 0.25);
    const label = h("span", { class: "tl" }, it.l);
    if (it.id) label.append(h("small", { class: "oid", text: `op ${it.id}` })); // a session call: its caller's operation id
    if (it.n) label.append(h("small", { text: `[${this.lanes[it.n]?.label ?? it.n}]` }));
    if (it.a) label.append(h("small", { text: `attempt ${it.a}` }));
    if (it.ra) label.append(h("small", { text: "run again" }));
    const node = h("div", {
      class: `tr k-${it.c} o-${outcome}${this.selected === it.k ? " sel" : ""}`,
      data: { i: idx, key: it.k, kind: it.c, outcome },
      title: it.l + (it.note ? ` — ${it.note}` : ""),
      style: { top: `${row * ROW}px`, "--kc": this.colors[it.c] || "#999" },
    },
    h("span", { class: "tt", text: `+${fmtMs(it.t0)}` }), gutter,
    h("span", { class: "tk", text: outcome === "replayed" ? "replayed" : it.c }), label,
    h("span", { class: "to", text: outcomeText(it, outcome) }),
    h("span", { class: "tb" }, h("i", { style: { left: `${left.toFixed(3)}%`, width: `${width.toFixed(3)}%` } })));
    return node;
  }

  // The whole run on one time axis: a band per lane column; losses, restores and failures as full-height marks.
  drawOverview() {
    const c = this.canvas;
    const w = c.clientWidth, h = c.clientHeight;
    if (!w || !h) return;
    const dpr = window.devicePixelRatio || 1;
    c.width = w * dpr; c.height = h * dpr;
    const g = c.getContext("2d");
    g.scale(dpr, dpr);
    const bands = Math.min(this.cols || 1, MAX_COLS);
    const bh = Math.min(Math.max(Math.floor((h - 8) / bands), 3), 14);
    const top = Math.max((h - bands * bh) / 2, 2);
    const now = Date.now() - this.base * 1000;
    for (const idx of this.view) {
      const it = this.items[idx];
      const x = (it.t0 / this.tmax) * w;
      const x1 = (this.endOf(it, now) / this.tmax) * w;
      g.fillStyle = this.colors[it.c] || "#999";
      if (it.c === "loss" || it.c === "lost" || it.c === "restore" || it.o === "failed") g.fillRect(x - 1, 0, Math.max(x1 - x, 2), h);
      else g.fillRect(x, top + (this.col.get(it.n) ?? 0) * bh, Math.max(x1 - x, 1), bh - 1);
    }
    this.drawWindow();
  }

  // The part of the run the list shows, over the overview (when the list does not show it all).
  drawWindow() {
    const win = this.window;
    const [first, last] = this.shown ?? [0, this.view.length - 1];
    if (!this.view.length || (first <= 0 && last >= this.view.length - 1)) { win.hidden = true; return; }
    const a = this.items[this.view[Math.max(first, 0)]], b = this.items[this.view[Math.max(last, 0)]];
    const x0 = (a.t0 / this.tmax) * 100, x1 = ((b.t1 ?? b.t0) / this.tmax) * 100;
    win.hidden = false;
    win.style.left = `${x0}%`;
    win.style.width = `max(${Math.max(x1 - x0, 0)}%, 2px)`;
  }

  jump(e) {
    const rect = this.canvas.getBoundingClientRect();
    const t = ((e.clientX - rect.left) / rect.width) * this.tmax;
    let lo = 0, hi = this.view.length - 1;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (this.items[this.view[mid]].t0 < t) lo = mid + 1; else hi = mid; }
    this.list.scrollTop = Math.max(0, lo * ROW - this.list.clientHeight / 2);
    if (this.view.length) this.select(this.view[lo]);
  }

  key(e) {
    if (e.key !== "ArrowDown" && e.key !== "ArrowUp") return;
    e.preventDefault();
    const row = this.view.indexOf(this.items.findIndex((it) => it.k === this.selected));
    const next = Math.min(Math.max((row < 0 ? -1 : row) + (e.key === "ArrowDown" ? 1 : -1), 0), this.view.length - 1);
    const y = next * ROW;
    if (y < this.list.scrollTop) this.list.scrollTop = y;
    if (y + ROW > this.list.scrollTop + this.list.clientHeight) this.list.scrollTop = y + ROW - this.list.clientHeight;
    this.select(this.view[next]);
  }

  select(idx) {
    const it = this.items[idx];
    if (!it) return;
    this.selected = it.k;
    for (const node of this.nodes?.values() ?? []) node.classList.toggle("sel", node.dataset.key === it.k);
    this.showRecord(it.k);
  }

  async showRecord(key) {
    const resp = await fetch(`/api/record?id=${encodeURIComponent(this.ref)}&key=${encodeURIComponent(key)}`);
    const d = await resp.json();
    if (key !== this.selected) return;
    if (!resp.ok) { this.detail.innerHTML = `<p class="error">${esc(d.error)}</p>`; return; }
    const it = this.byKey.get(key) || {};
    const parts = [`<h3><span class="badge k-${esc(d.kind)}">${esc(d.kind)}</span> ${esc(d.label)}</h3>`,
      `<dl><dt>outcome</dt><dd>${esc(d.outcome)}</dd>` + (d.op ? `<dt>op id</dt><dd>${esc(d.op)}</dd>` : "") +
      `<dt>attempt</dt><dd>${esc(d.attempt)}</dd><dt>at</dt><dd>+${fmtMs(it.t0)}${it.t1 != null ? " → +" + fmtMs(it.t1) + " (" + fmtMs(it.t1 - it.t0) + ")" : ""}</dd></dl>`];
    if (d.note) parts.push(`<p>${esc(d.note)}</p>`);
    if (d.replayOf) parts.push(`<p>Replays the call recorded as <a href="#" data-goto="${esc(d.replayOf)}">${esc(d.replayOf)}</a>; the records below are that call's.</p>`);
    for (const r of d.rows || []) parts.push(recordHtml(r, this.base));
    if (d.event) parts.push(`<pre>${esc(d.event.text)}</pre>${cut(d.event)}`);
    this.detail.innerHTML = parts.join("");
    this.detail.querySelectorAll("[data-goto]").forEach((a) => a.addEventListener("click", (e) => {
      e.preventDefault();
      const idx = this.items.findIndex((x) => x.k === a.dataset.goto);
      const row = this.view.indexOf(idx);
      if (row >= 0) this.list.scrollTop = Math.max(0, row * ROW - this.list.clientHeight / 2);
      this.select(idx);
    }));
  }
}

// The run's header, rendered by the server from the page's own template, replaces the shown one; what the
// user has typed into a callback's form (and where the cursor is) carries over, so a live update never
// throws away a value being written.
function replaceHeader(html) {
  const header = $("#run-header");
  const fresh = document.createElement("div");
  fresh.innerHTML = html;
  const focused = document.activeElement;
  let refocus = null;
  for (const form of header.querySelectorAll("form.callback")) {
    const twin = [...fresh.querySelectorAll("form.callback")].find((f) => f.dataset.callback === form.dataset.callback);
    if (!twin) continue;
    for (const el of form.querySelectorAll("textarea, input[type=checkbox]")) {
      const other = twin.querySelector(`[name="${el.name}"]`);
      if (!other) continue;
      if (el.type === "checkbox") other.checked = el.checked;
      else other.value = el.value;
      if (el === focused) refocus = [other, el.selectionStart, el.selectionEnd];
    }
  }
  header.replaceChildren(...fresh.childNodes);
  if (refocus) {
    const [el, start, end] = refocus;
    el.focus();
    el.setSelectionRange(start, end);
  }
}

// h("div", {class, title, type, data: {...}, style: {...}, text}, ...children): an element, made safely.
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "style") for (const [p, val] of Object.entries(v)) el.style.setProperty(p, val);
    else if (k === "data") for (const [p, val] of Object.entries(v)) el.dataset[p] = val;
    else if (k === "text") el.textContent = v;
    else if (k === "class") { if (v) el.className = v; }
    else el.setAttribute(k, v);
  }
  for (const c of children) el.append(c);
  return el;
}

// An item's op id: sent only when it differs from the item's key (a journal item's key is its op id).
function opOf(it) {
  return it.op ?? (it.r === 0 ? it.k : "");
}

function order(a, b) {
  return a.t0 - b.t0 || a.r - b.r || a.s - b.s;
}

function outcomeText(it, outcome) {
  if (it.x != null) return `exit ${it.x}`;
  return { ok: "", running: "running", waiting: "waiting", retrying: "retrying", failed: "failed", replayed: "", warning: "", unfinished: "unfinished", info: "" }[outcome] ?? outcome;
}

function recordHtml(r, base) {
  const out = [`<div class="rec"><dl><dt>row</dt><dd>#${r.seq} ${esc(r.status)} · attempt ${r.attempt} · ${new Date(r.ts * 1000).toISOString()} (+${fmtMs((r.ts - base) * 1000)})</dd>`];
  if (r.inputDigest) out.push(`<dt>input digest</dt><dd>${esc(r.inputDigest)}</dd>`);
  if (r.exitCode != null) out.push(`<dt>exit code</dt><dd>${esc(r.exitCode)}</dd>`);
  out.push("</dl>");
  if (r.meta) out.push(`<div class="dim">inputs and bookkeeping (meta)</div><pre>${esc(r.meta.text)}</pre>${cut(r.meta)}`);
  for (const s of ["stdout", "stderr"]) if (r[s] && r[s].text) out.push(`<div class="dim">${s}</div><pre>${esc(r[s].text)}</pre>${cut(r[s])}`);
  if (r.result) out.push(`<div class="dim">result</div><pre>${esc(r.result.text)}</pre>${cut(r.result)}`);
  if (r.error) out.push(`<div class="dim">error</div><pre>${esc(JSON.stringify(r.error, null, 2))}</pre>`);
  out.push("</div>");
  return out.join("");
}

function cut(v) {
  return v && v.cut ? `<p class="cut">… ${v.cut} more characters: <code>dsb history -o json</code> has all of it.</p>` : "";
}

function fmtMs(ms) {
  if (ms == null || Number.isNaN(ms)) return "-";
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 1 : 0)}ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 3 : 1)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}
