// cce_duck dashboard: watches one session through the REST API of the same server.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  // known: whether the session exists (null: not asked yet); a new one is not asked for its turns
  const state = { replaying: false, stop: false, series: [], known: null };
  const url = new URL(window.location.href);
  if (url.searchParams.get("session")) $("session").value = url.searchParams.get("session");
  if (url.searchParams.get("delay") !== null) $("delay").value = url.searchParams.get("delay");
  $("apikey").value = sessionStorage.getItem("cce-key") || "";

  const sid = () => $("session").value.trim();
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const text = (s) => document.createTextNode(s);

  function status(msg, kind) {
    const el = $("status");
    el.textContent = msg;
    el.className = kind || "";
  }

  async function api(method, path, body) {
    const headers = { accept: "application/json" };
    const key = $("apikey").value.trim();
    if (key) headers.authorization = "Bearer " + key;
    if (body !== undefined) headers["content-type"] = "application/json";
    const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const data = await res.json().catch(() => null);
    if (!res.ok) {
      const e = (data && data.error) || {};
      const err = new Error(res.status + " " + (e.type || "error") + ": " + (e.message || res.statusText));
      err.status = res.status;
      throw err;
    }
    return data;
  }

  const session = (suffix) => "/v1/sessions/" + encodeURIComponent(sid()) + suffix;

  function seriesKey() { return "cce-series-" + sid(); }
  function loadSeries() {
    try { state.series = JSON.parse(localStorage.getItem(seriesKey()) || "[]"); } catch (e) { state.series = []; }
  }
  function saveSeries() { localStorage.setItem(seriesKey(), JSON.stringify(state.series)); }

  function li(parts) {
    const item = document.createElement("li");
    for (const [cls, value] of parts) {
      const span = document.createElement("span");
      if (cls) span.className = cls;
      span.textContent = value;
      item.appendChild(span);
    }
    return item;
  }

  function fill(id, items) {
    const el = $(id);
    el.replaceChildren(...items);
    el.scrollTop = el.scrollHeight;
  }

  async function exists() {
    if (state.known === null) {
      const listed = (await api("GET", "/v1/sessions")).sessions;
      state.known = listed.some((s) => s.session_id === sid());
    }
    return state.known;
  }

  async function refresh() {
    let turns = [];
    let notes = [];
    let summary = null;
    if (await exists()) {
      try {
        turns = (await api("GET", session("/turns"))).turns;
        notes = (await api("GET", session("/notes"))).notes;
        summary = (await api("GET", session("/summary"))).summary;
      } catch (err) {
        if (err.status !== 404) throw err;
        state.known = false;  // deleted meanwhile
      }
    }
    const hot = turns.filter((t) => t.state === "hot");
    const pending = turns.filter((t) => t.state === "pending");
    const line = (t) => li([["span", "#" + t.turn_no + " "], ["who", (t.speaker || t.role) + ": "], ["", t.content || t.micro]]);
    fill("tier-hot", hot.map(line));
    fill("tier-pending", pending.map(line));
    fill("tier-warm", notes.map((n) => li([["label", n.label], ["span", " · turns " + n.start_turn + "–" + n.end_turn + "\n"],
      ["", n.summary]])));
    $("tier-cold").textContent = summary || "";
    $("count-hot").textContent = hot.length;
    $("count-pending").textContent = pending.length;
    $("count-warm").textContent = notes.length;
    $("count-cold").textContent = summary ? 1 : 0;
    $("history").textContent = turns.map((t) => "#" + t.turn_no + " " + (t.speaker || t.role) + ": " + (t.content || t.micro)).join("\n");
    $("history-tokens").textContent = turns.reduce((a, t) => a + t.tokens + 4, 0);
    drawPlot();
    return turns;
  }

  function drawPlot() {
    const s = state.series;
    const W = 800, H = 220, L = 48, B = 24, T = 10, R = 10;
    const maxY = Math.max(100, ...s.map((p) => p.full));
    const maxX = Math.max(2, ...s.map((p) => p.turns));
    const x = (v) => L + (W - L - R) * (v / maxX);
    const y = (v) => H - B - (H - B - T) * (v / maxY);
    $("line-full").setAttribute("points", s.map((p) => x(p.turns).toFixed(1) + "," + y(p.full).toFixed(1)).join(" "));
    $("line-sent").setAttribute("points", s.map((p) => x(p.turns).toFixed(1) + "," + y(p.sent).toFixed(1)).join(" "));
    const axes = $("axes");
    const ns = "http://www.w3.org/2000/svg";
    const parts = [];
    for (let i = 0; i <= 4; i += 1) {
      const v = Math.round(maxY * i / 4);
      const ln = document.createElementNS(ns, "line");
      ln.setAttribute("x1", L); ln.setAttribute("x2", W - R); ln.setAttribute("y1", y(v)); ln.setAttribute("y2", y(v));
      const tx = document.createElementNS(ns, "text");
      tx.setAttribute("x", 4); tx.setAttribute("y", y(v) + 4); tx.textContent = v;
      parts.push(ln, tx);
    }
    const xl = document.createElementNS(ns, "text");
    xl.setAttribute("x", W - 120); xl.setAttribute("y", H - 6); xl.textContent = "messages: " + maxX;
    parts.push(xl);
    axes.replaceChildren(...parts);
    const last = s[s.length - 1];
    $("plot-caption").textContent = last
      ? "After " + last.turns + " messages: " + last.sent + " tokens sent instead of " + last.full
        + " (" + Math.round(100 * (last.full - last.sent) / Math.max(1, last.full)) + "% saved)."
      : "Replay or type messages: each user message adds a point (the context its answer would get).";
  }

  async function measure(query, turnsCount) {
    const p = await api("POST", session("/context"), { query, max_tokens: Number($("max-tokens").value) || 500 });
    // what the call would cost without memory: the whole history, and the pins
    state.series.push({ turns: turnsCount, sent: p.tokens, full: p.full_tokens + (p.pin_tokens || 0) });
    saveSeries();
  }

  async function add(role, content, timestamp) {
    const msg = { role, content };
    if (timestamp) msg.timestamp = timestamp;
    const r = await api("POST", session("/messages"), { messages: [msg] });
    state.known = true;
    if (role === "user") await measure(content, r.turns[0] + 1);
    return r.turns[0];
  }

  async function replay() {
    if (state.replaying) return;
    state.replaying = true;
    state.stop = false;
    $("replay").disabled = true;
    $("stop").disabled = false;
    try {
      const sample = await api("GET", "/ui/sample.json");
      let n = 0;
      for (const m of sample.messages) {
        if (state.stop) break;
        await add(m.role, m.content, m.timestamp);
        n += 1;
        await refresh();
        status("replayed " + n + " / " + sample.messages.length, "ok");
        const delay = Number($("delay").value);
        if (delay > 0) await sleep(delay);
      }
      status(state.stop ? "replay stopped after " + n + " messages" : "replay done: " + n + " messages", "ok");
      if (!$("question").value) $("question").value = sample.question || "";
    } catch (err) {
      status(err.message, "error");
    } finally {
      state.replaying = false;
      $("replay").disabled = false;
      $("stop").disabled = true;
    }
  }

  async function ask() {
    const q = $("question").value.trim();
    if (!q) return;
    try {
      const p = await api("POST", session("/context"), { query: q, max_tokens: Number($("max-tokens").value) || 500, explain: true });
      $("context").textContent = p.messages.map((m) => "[" + m.role + (m.name ? " " + m.name : "") + "]\n" + m.content).join("\n\n");
      $("context-tokens").textContent = p.tokens;
      $("history-tokens").textContent = p.full_tokens + (p.pin_tokens || 0);
      const ex = p.explain;
      const b = ex.budget;
      $("budget").textContent = "budget " + b.used + " / " + b.max_tokens + " · pins " + b.pins + " · system note "
        + b.system_note + " · recent " + b.recent + " · pending " + b.pending + " · notes " + b.notes + " · overhead "
        + b.overhead + " · free " + b.free + (ex.overview ? " · overview" : "");
      // in context: quoted under a note, or sent verbatim as a recent turn
      const quoted = new Set(ex.chosen.flatMap((c) => (c.quotes || []).map((q2) => q2.turn_no)));
      const verbatim = new Set(ex.verbatim_turns || []);
      const why = new Map((ex.dropped || []).filter((d) => d.turn_no !== undefined).map((d) => [d.turn_no, d.reason]));
      const fmt = (v, digits) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
      const row = (values, cls) => {
        const tr = document.createElement("tr");
        if (cls) tr.className = cls;
        for (const v of values) {
          const td = document.createElement("td");
          td.appendChild(text(String(v)));
          tr.appendChild(td);
        }
        return tr;
      };
      $("chosen").tBodies[0].replaceChildren(...ex.chosen.map((c) => row([c.label || "", c.start_turn + "–" + c.end_turn,
        (c.quotes || []).length, fmt(c.dense, 3), fmt(c.bm25, 2), fmt(c.recency, 2), fmt(c.fused, 4)])));
      const rows = ex.hits.slice(0, 25).map((h) => {
        const where = quoted.has(h.turn_no) ? "quoted" : verbatim.has(h.turn_no) ? "verbatim" : "";
        return row([h.rank, h.turn_no, h.note_id === null ? "–" : h.note_id, fmt(h.dense, 3), fmt(h.bm25, 2),
          fmt(h.recency, 2), fmt(h.fused, 4), where || "✗ " + (why.get(h.turn_no) || "")], where ? "chosen" : "");
      });
      $("explain").tBodies[0].replaceChildren(...rows);
      status("context: " + p.tokens + " of " + (p.full_tokens + (p.pin_tokens || 0)) + " tokens"
        + (p.verbatim ? " (the history fits: sent as it is)" : ""), "ok");
    } catch (err) {
      status(err.message, "error");
    }
  }

  $("apikey").addEventListener("change", () => sessionStorage.setItem("cce-key", $("apikey").value.trim()));
  $("session").addEventListener("change", () => { state.known = null; });
  $("load").addEventListener("click", () => { state.known = null; loadSeries(); refresh().then(() => status("loaded " + sid(), "ok"), (e) => status(e.message, "error")); });
  $("replay").addEventListener("click", replay);
  $("stop").addEventListener("click", () => { state.stop = true; });
  $("composer").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const content = $("message").value;
    if (!content.trim()) return;
    try {
      const n = await add($("role").value, content);
      $("message").value = "";
      await refresh();
      status("stored turn " + n, "ok");
    } catch (err) { status(err.message, "error"); }
  });
  $("close-session").addEventListener("click", async () => {
    try { await api("POST", session("/close")); await refresh(); status("session closed", "ok"); } catch (err) { status(err.message, "error"); }
  });
  $("ask-form").addEventListener("submit", (ev) => { ev.preventDefault(); ask(); });
  loadSeries();
  refresh().then(() => status("ready", "ok"), (e) => status(e.message, "error"));
})();
