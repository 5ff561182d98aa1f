// Sluice's dashboard: polls status.json with the bearer token and draws
// what it answers. Every value from the server goes in through
// textContent, never as markup: keys are chosen by clients.
"use strict";

(function () {
  const POLL_MS = 1000;
  const HISTORY_MS = 5 * 60 * 1000;
  const COLOURS = ["#1f77b4", "#e4572e", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  const $ = (id) => document.getElementById(id);

  // history: one sample per answer, {t, totals: {limit: [decisions, denied]}}.
  let history = [];
  let token = sessionStorage.getItem("sluice-token") || "";
  let timer = null;
  // gen counts starts and stops: a poll answered after its start was
  // superseded (a new token, a refusal) is ignored.
  let gen = 0;

  // A token in the URL's fragment (#token=...), which a browser never
  // sends: taken, kept for the tab's session, and removed from the URL.
  function tokenFromHash() {
    const hash = new URLSearchParams(location.hash.slice(1));
    if (!hash.get("token")) return false;
    token = hash.get("token");
    sessionStorage.setItem("sluice-token", token);
    window.history.replaceState(null, "", location.pathname + location.search);
    return true;
  }
  tokenFromHash();

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function row(cells, numFrom) {
    const tr = el("tr");
    cells.forEach((c, i) => {
      const td = c instanceof Node ? wrap("td", c) : el("td", c);
      if (numFrom !== undefined && i >= numFrom) td.className = "num";
      tr.appendChild(td);
    });
    return tr;
  }

  function wrap(tag, child) {
    const e = el(tag);
    e.appendChild(child);
    return e;
  }

  function fill(tbody, rows, cols) {
    tbody.replaceChildren();
    if (rows.length === 0) {
      const td = el("td", "none", "empty");
      td.colSpan = cols;
      tbody.appendChild(wrap("tr", td));
    }
    rows.forEach((r) => tbody.appendChild(r));
  }

  function setState(text, bad) {
    const s = $("state");
    s.textContent = text;
    s.className = bad ? "state bad" : "state";
  }

  // clear empties every view: nothing is shown without the token.
  function clear() {
    history = [];
    $("limits").replaceChildren();
    $("leases").replaceChildren();
    $("rules").tBodies[0].replaceChildren();
    $("semaphores").tBodies[0].replaceChildren();
    $("coord-semaphores").tBodies[0].replaceChildren();
    $("coord-leases").tBodies[0].replaceChildren();
    $("store").replaceChildren();
    $("reload").textContent = "";
    $("legend").replaceChildren();
    drawChart();
  }

  const name = (l) => (l.domain ? l.domain + " / " : "") + l.name;

  function fmtMs(ms) {
    if (ms < 1000) return ms + " ms";
    if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
    return (ms / 60000).toFixed(1) + " min";
  }

  function renderRules(rs) {
    const rows = [];
    (rs ? rs.domains : []).forEach((d) => {
      d.rules.forEach((r) => {
        const o = r.override ? r.override.limit + " for " + fmtMs(r.override.expires_in_ms) + (r.override.reason ? " (" + r.override.reason + ")" : "") : "";
        rows.push(row([d.name, r.name, r.unlimited ? "unlimited" : r.limit + (r.cost_unit ? " " + r.cost_unit : ""), r.period || r.calendar || "", r.algorithm || "", r.failure_mode || "", o, r.source]));
      });
    });
    fill($("rules").tBodies[0], rows, 8);
    const rl = rs && rs.reload;
    const p = $("reload");
    if (!rl) {
      p.textContent = "";
    } else if (rl.last_error) {
      p.textContent = "last reload failed: " + rl.last_error + " (the last good rules stay in force)";
      p.className = "note bad";
    } else {
      p.textContent = "rules loaded " + rl.loads + " times, " + rl.failures + " failed; last good load " + (rl.last_good || "at start");
      p.className = "note";
    }
  }

  function topTable(caption, head, rows, cols) {
    const t = el("table");
    t.appendChild(el("caption", caption));
    const h = el("tr");
    head.forEach((c, i) => h.appendChild(el("th", c, i > 0 ? "num" : "")));
    t.appendChild(wrap("thead", h));
    const b = el("tbody");
    fill(b, rows, cols);
    t.appendChild(b);
    return t;
  }

  function bar(used) {
    const s = el("span", null, "bar");
    s.style.width = Math.round(used * 60) + "px";
    return s;
  }

  function renderLimits(limits) {
    const box = $("limits");
    box.replaceChildren();
    if (limits.length === 0) box.appendChild(el("p", "no limits are tracked", "empty"));
    limits.forEach((l) => {
      const div = el("div", null, "limit");
      div.dataset.limit = name(l);
      const lim = l.limit ? " — " + l.limit + (l.cost_unit ? " " + l.cost_unit : "") + (l.window ? " per " + l.window : "") : "";
      const sampled = l.sample > 1 ? " (1 in " + l.sample + " counted)" : "";
      div.appendChild(el("h3", name(l) + lim + ": " + l.decisions + " decisions, " + l.denied + " denied" + sampled));
      const tables = el("div", null, "tables");
      // The bound of a count: the sketch's error, and 3σ of the sampling's.
      const bound = (e) => e.err + 3 * (e.sigma || 0);
      tables.appendChild(topTable("hottest", ["key", "decisions", "± err"],
        l.hot.map((e) => row([e.key, e.count, bound(e)], 1)), 3));
      tables.appendChild(topTable("most denied", ["key", "denied", "± err"],
        (l.denied_keys || []).map((e) => row([e.key, e.denied, bound(e)], 1)), 3));
      tables.appendChild(topTable("nearest the limit", ["key", "used", "", "whole in"],
        (l.near || []).map((e) => row([e.key, Math.round(e.used * 100) + "%", bar(e.used), fmtMs(Math.round(e.whole_in_ns / 1e6))], 1)), 4));
      div.appendChild(tables);
      box.appendChild(div);
    });
  }

  function renderLeases(leases) {
    const box = $("leases");
    box.replaceChildren();
    if (leases.length === 0) box.appendChild(el("p", "no lease holders in this process", "empty"));
    leases.forEach((l) => {
      box.appendChild(el("h3", l.name + " — capacity " + l.capacity + " in " + l.partitions + " partitions" + (l.outage ? " — STORE OUTAGE" : "")));
      const t = el("table");
      const h = el("tr");
      ["member", "granted", "rate", "used", "idle", "demand", "leases", "need", "want"].forEach((c, i) => h.appendChild(el("th", c, i ? "num" : "")));
      t.appendChild(wrap("thead", h));
      const b = el("tbody");
      const f = (x) => (Math.round(x * 10) / 10).toString();
      b.appendChild(row([l.member + " (this process)", f(l.granted), f(l.rate), f(l.used), f(l.idle), f(l.demand), l.leases, l.need, l.want], 1));
      t.appendChild(b);
      box.appendChild(t);
      if (l.members) {
        const rows = l.members.map((m) => row([m.id, m.weight, m.has, m.need, m.want, m.expires_in_ms ? fmtMs(m.expires_in_ms) : ""], 1));
        box.appendChild(topTable("members, as seen " + fmtMs(l.view_age_ms) + " ago", ["member", "weight", "has", "needs", "wants", "first lease expires in"], rows, 6));
      }
    });
  }

  function renderSemaphores(sems) {
    fill($("semaphores").tBodies[0], sems.map((s) => row([s.name, s.limit, s.held, s.waiting], 1)), 4);
  }

  // renderCoordination shows what the coordination API holds: one row
  // per holder of each semaphore, the semaphore's own cells on its first
  // row (and one row for a semaphore held by nobody).
  function renderCoordination(c) {
    const rows = [];
    ((c && c.semaphores) || []).forEach((s) => {
      const head = [s.name, s.limit, s.held, s.waiting, s.queued < 0 ? "" : s.queued];
      const blank = head.map(() => "");
      if (s.error) {
        rows.push(row(head.concat(["", "", "cannot read: " + s.error, ""]), 1));
        return;
      }
      if (s.holders.length === 0) rows.push(row(head.concat(["", "", "", ""]), 1));
      s.holders.forEach((h, i) => {
        const heldFor = h.held_for_ms === undefined ? "unknown" : fmtMs(h.held_for_ms);
        const tr = row((i === 0 ? head : blank).concat([h.fence, h.weight, heldFor, fmtMs(h.expires_in_ms)]), 1);
        tr.dataset.fence = h.fence;
        rows.push(tr);
      });
    });
    fill($("coord-semaphores").tBodies[0], rows, 9);
    renderCoordLeases((c && c.leases) || []);
    $("coordination-section").hidden = !c;
  }

  // renderCoordLeases shows the leased services the coordination API runs
  // remote holders for: one row per holder (by its member id in the
  // store), the service's own cells on its first row.
  function renderCoordLeases(svcs) {
    const rows = [];
    const f = (x) => (Math.round(x * 10) / 10).toString();
    svcs.forEach((s) => {
      const head = [s.service, f(s.capacity), s.partitions, s.holder_count];
      const blank = head.map(() => "");
      if (s.holders.length === 0) rows.push(row(head.concat(["", "", "", "", "", "", "", "", ""]), 1));
      s.holders.forEach((h, i) => {
        const tr = row((i === 0 ? head : blank).concat([h.member, f(h.weight), fmtMs(h.joined_for_ms) + " ago", f(h.rate) + "/s",
          f(h.demand_rate) + "/s", h.backlog, h.leases, fmtMs(h.valid_for_ms), fmtMs(h.heartbeat_ago_ms) + " ago"]), 1);
        tr.children[4].className = ""; // the member id, a name
        tr.dataset.member = h.member;
        rows.push(tr);
      });
      const more = s.holder_count - s.holders.length;
      if (more > 0) rows.push(row(blank.concat(["(" + more + " more)", "", "", "", "", "", "", "", ""]), 1));
    });
    fill($("coord-leases").tBodies[0], rows, 13);
  }

  function renderStore(s) {
    const dl = $("store");
    dl.replaceChildren();
    if (!s) return;
    const add = (k, v, cls) => { dl.appendChild(el("dt", k)); dl.appendChild(el("dd", v, cls)); };
    add("kind", s.kind + (s.mode ? " (" + s.mode + ")" : ""));
    add("health", s.healthy ? "healthy" : "DOWN" + (s.error ? ": " + s.error : ""), s.healthy ? "ok" : "bad");
    if (s.breaker) add("breaker", s.breaker, s.breaker === "closed" ? "ok" : "bad");
    if (s.latency_ms) add("latency", s.latency_ms.toFixed(2) + " ms");
    add("failed calls", s.errors);
    add("failure-mode decisions", "fail_open " + s.fail_open + ", fail_closed " + s.fail_closed + ", local " + s.local);
    if (s.keys) add("keys held", s.keys);
  }

  // The chart: per limit, decisions/s (solid) and denials/s (dashed),
  // from the differences of successive answers' totals.
  function drawChart() {
    const c = $("chart");
    const g = c.getContext("2d");
    g.clearRect(0, 0, c.width, c.height);
    const legend = $("legend");
    legend.replaceChildren();
    const series = {};
    for (let i = 1; i < history.length; i++) {
      const a = history[i - 1], b = history[i];
      const dt = (b.t - a.t) / 1000;
      if (dt <= 0) continue;
      for (const k in b.totals) {
        const p = a.totals[k];
        if (!p) continue;
        (series[k] = series[k] || []).push({ t: b.t, d: Math.max(0, b.totals[k][0] - p[0]) / dt, x: Math.max(0, b.totals[k][1] - p[1]) / dt });
      }
    }
    const names = Object.keys(series).sort((a, b) => sum(series[b]) - sum(series[a])).slice(0, COLOURS.length);
    let max = 0;
    names.forEach((k) => series[k].forEach((p) => { max = Math.max(max, p.d, p.x); }));
    c.dataset.samples = String(history.length);
    c.dataset.max = max.toFixed(3);
    const W = c.width, H = c.height, L = 56, B = 22, now = Date.now();
    // The time axis spans what was seen, at least a minute, at most HISTORY_MS.
    const span = Math.min(HISTORY_MS, Math.max(60000, history.length ? now - history[0].t : 0));
    g.strokeStyle = "#dde1e6"; g.fillStyle = "#5b6670"; g.font = "11px system-ui"; g.lineWidth = 1;
    const top = max > 0 ? niceMax(max) : 1;
    for (let i = 0; i <= 4; i++) {
      const y = H - B - (H - B - 8) * i / 4;
      g.beginPath(); g.moveTo(L, y); g.lineTo(W, y); g.stroke();
      g.fillText((top * i / 4).toFixed(top < 4 ? 1 : 0) + "/s", 4, y + 4);
    }
    for (let m = 0; m <= 5; m++) {
      const ago = span * m / 5 / 1000;
      g.fillText(m === 0 ? "now" : "-" + (ago >= 120 ? (ago / 60).toFixed(1) + " min" : Math.round(ago) + " s"), W - 30 - (W - L - 30) * m / 5, H - 6);
    }
    const xOf = (t) => W - (W - L) * (now - t) / span;
    const yOf = (v) => H - B - (H - B - 8) * v / top;
    names.forEach((k, i) => {
      g.strokeStyle = COLOURS[i]; g.lineWidth = 2;
      [["d", []], ["x", [5, 4]]].forEach(([f, dash]) => {
        g.setLineDash(dash); g.beginPath();
        series[k].forEach((p, j) => (j ? g.lineTo(xOf(p.t), yOf(p[f])) : g.moveTo(xOf(p.t), yOf(p[f]))));
        g.stroke();
      });
      g.setLineDash([]);
      const s = el("span", k + " (solid: decisions, dashed: denials)");
      const sw = el("i"); sw.style.background = COLOURS[i];
      s.prepend(sw);
      legend.appendChild(s);
    });
  }

  const sum = (ps) => ps.reduce((a, p) => a + p.d, 0);
  function niceMax(v) {
    const e = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * e) return m * e;
    return 10 * e;
  }

  // refusal explains a 401, 403 or 429 and how to go on: the page stops
  // polling, so that a tab left open with a stale token does not keep
  // failing (and spending its address's failed-authentication budget).
  function refusal(r) {
    let why = "the token was refused (" + r.status + ")";
    if (r.status === 429) {
      const ra = r.headers.get("Retry-After");
      why = "too many failed authentications from this address (429" + (ra ? ", retry after " + ra + " s" : "") + ")";
    } else if (r.status === 403) {
      why = "access forbidden (403)";
    }
    return "stopped: " + why + ". Enter the right token above and press Use, or reload the page to try again.";
  }

  function stop() {
    gen++;
    if (timer) clearTimeout(timer);
    timer = null;
  }

  async function poll(g) {
    if (!token) { clear(); setState("no data: enter the admin token", true); return false; }
    let st;
    try {
      const r = await fetch("status.json", { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
      if (g !== gen) return false;
      if (r.status === 401 || r.status === 403 || r.status === 429) {
        clear();
        setState(refusal(r), true);
        return false; // no more polls until a token is entered or the page reloads
      }
      if (!r.ok) throw new Error("status " + r.status);
      st = await r.json();
    } catch (e) {
      if (g !== gen) return false;
      setState("cannot reach the server: " + e.message, true);
      return true;
    }
    if (g !== gen) return false;
    document.title = st.title;
    $("title").textContent = st.title;
    const totals = {};
    st.limits.forEach((l) => { totals[name(l)] = [l.decisions, l.denied]; });
    const t = Date.parse(st.time) || Date.now();
    history.push({ t: Date.now(), totals: totals, server: t });
    while (history.length > 2 && Date.now() - history[0].t > HISTORY_MS) history.shift();
    renderRules(st.rules);
    renderLimits(st.limits);
    renderLeases(st.leases);
    renderSemaphores(st.semaphores);
    renderCoordination(st.coordination);
    renderStore(st.store);
    drawChart();
    setState("live · " + new Date(t).toLocaleTimeString(), false);
    return true;
  }

  // start polls now, then POLL_MS after each answer, until a refusal or
  // the next start; one poll at a time.
  function start() {
    stop();
    const g = gen;
    const loop = async () => {
      const again = await poll(g);
      if (again && g === gen) timer = setTimeout(loop, POLL_MS);
    };
    loop();
  }

  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token = $("token").value.trim();
    $("token").value = "";
    if (token) sessionStorage.setItem("sluice-token", token); else sessionStorage.removeItem("sluice-token");
    start();
  });
  window.addEventListener("hashchange", () => { if (tokenFromHash()) start(); });
  $("forget").addEventListener("click", () => {
    token = "";
    sessionStorage.removeItem("sluice-token");
    start();
  });
  start();
})();
