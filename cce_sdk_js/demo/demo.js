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

  function split() {
    $("error").textContent = "";
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
      $("topics").replaceChildren();
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
      box.append(h, span);
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
    try {
      var p = engine.context(SID, $("question").value, { maxTokens: Number($("max-tokens").value) || 400 });
      $("context").textContent = p.toString();
      $("context-tokens").textContent = p.tokens;
      $("history-tokens").textContent = p.fullTokens;
      var pct = Math.round(100 * p.tokens / Math.max(1, p.fullTokens));
      $("bar").style.width = Math.min(100, pct) + "%";
      $("savings").textContent = "The model gets " + p.tokens + " of " + p.fullTokens + " tokens (" + pct + "%), "
        + p.notes.length + " topic" + (p.notes.length === 1 ? "" : "s") + " quoted.";
      $("error").textContent = "";
    } catch (err) {
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
