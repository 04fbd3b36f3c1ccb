// The browser demo's page logic (uses the bundled lite engine as the global CCE).
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var COLORS = ["#1c7ed6", "#2b8a3e", "#e8590c", "#9c36b5", "#c2255c", "#0ca678", "#f08c00", "#3b5bdb"];
  var engine = null;
  var SID = "pasted";

  function parse(text) {
    var t = text.trim();
    if (t.charAt(0) === "[") {
      var data = JSON.parse(t);
      return data.map(function (m) { return { role: m.role, content: m.content, timestamp: m.timestamp }; });
    }
    return CCE.parseTranscript(t);
  }

  // every result shown, emptied (before new results, and when an error replaces them)
  function clearResults() {
    $("topics").replaceChildren();
    ["summary", "history", "context", "savings"].forEach(function (id) { $(id).textContent = ""; });
    $("history-tokens").textContent = "0";
    $("context-tokens").textContent = "0";
    $("bar").style.width = "0";
  }

  function clearContext() {
    $("context").textContent = "";
    $("context-tokens").textContent = "0";
    $("savings").textContent = "";
    $("bar").style.width = "0";
  }

  function split() {
    $("error").textContent = "";
    clearResults();
    try {
      var messages = parse($("conversation").value);
      // pasted text has no times: one minute apart, so only the words decide the topics
      var start = Date.UTC(2026, 0, 1, 9, 0);
      messages.forEach(function (m, i) { if (!m.timestamp) m.timestamp = new Date(start + i * 60000).toISOString(); });
      engine = CCE.createEngine();
      engine.ingest(SID, messages);
      render();
    } catch (err) {
      engine = null;
      clearResults();
      $("error").textContent = err.message;
    }
  }

  function render() {
    var notes = engine.notes(SID);
    var turns = engine.turns(SID);
    var boxes = notes.map(function (n, i) {
      var box = document.createElement("div");
      box.className = "topic";
      box.style.setProperty("--c", COLORS[i % COLORS.length]);
      var h = document.createElement("h3");
      h.textContent = "Topic " + (i + 1) + ": " + n.label;
      var span = document.createElement("div");
      span.className = "turns";
      span.textContent = "messages " + (n.start_turn + 1) + "–" + (n.end_turn + 1) + " · " + n.raw_tokens + " tokens";
      var p = document.createElement("p");
      p.textContent = n.summary;
      box.append(h, span, p);
      return box;
    });
    var recent = turns.filter(function (t) { return t.state !== "compressed"; });
    if (recent.length) {
      var box = document.createElement("div");
      box.className = "topic";
      box.style.setProperty("--c", "#adb5bd");
      var h = document.createElement("h3");
      h.textContent = "Recent messages (kept verbatim)";
      var span = document.createElement("div");
      span.className = "turns";
      span.textContent = "messages " + (recent[0].turn_no + 1) + "–" + (recent[recent.length - 1].turn_no + 1);
      var list = document.createElement("ul");
      list.className = "recent";
      recent.forEach(function (t) {
        var item = document.createElement("li");
        item.textContent = (t.speaker || t.role) + ": " + t.content;
        list.appendChild(item);
      });
      box.append(h, span, list);
      boxes.push(box);
    }
    $("topics").replaceChildren.apply($("topics"), boxes);
    $("summary").textContent = turns.length + " messages → " + notes.length + " topics + " + recent.length + " recent";
    $("history").textContent = turns.map(function (t) { return (t.speaker || t.role) + ": " + t.content; }).join("\n");
    $("history-tokens").textContent = engine.stats(SID)[0].full_tokens;
  }

  function ask(ev) {
    ev.preventDefault();
    if (!engine) split();
    if (!engine) return;
    clearContext();
    try {
      var budget = $("max-tokens").value.trim();
      var p = engine.context(SID, $("question").value, { maxTokens: budget === "" ? 400 : Number(budget) });
      var full = p.fullTokens + p.pinTokens;  // what sending the history as it is would cost
      $("context").textContent = p.toString();
      $("context-tokens").textContent = p.tokens;
      $("history-tokens").textContent = full;
      var pct = Math.round(100 * p.tokens / Math.max(1, full));
      $("bar").style.width = Math.min(100, pct) + "%";
      $("savings").textContent = "The model gets " + p.tokens + " of " + full + " tokens (" + pct + "%), "
        + (p.verbatim ? "the whole history: it fits." : p.notes.length + " topic"
        + (p.notes.length === 1 ? "" : "s") + " quoted.");
      $("error").textContent = "";
    } catch (err) {
      clearContext();
      $("error").textContent = err.message;
    }
  }

  $("sample").addEventListener("click", function () {
    $("conversation").value = SAMPLE;
    if (!$("question").value) $("question").value = "What freezer alert threshold did we settle on?";
    split();
  });
  $("split").addEventListener("click", split);
  $("ask").addEventListener("submit", ask);
})();
