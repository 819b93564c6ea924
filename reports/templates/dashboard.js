// kvconform dashboard: the diff of any two runs, in the browser, from data/tests.js (every test key)
// and data/ENTRY.js (one character per test key: its outcome there; notes on what did not pass).
// Loaded as <script> files, not fetched: pages opened from disk may not fetch files.
"use strict";
var kvcDashboard = (function () {
  var keys = [], entries = {}, waiting = {};
  var WORD = {P: "✓ pass", F: "✗ FAIL", E: "✗ ERROR", C: "✗ CRASH", T: "✗ TIMEOUT", X: "! unexpected pass", K: "✗ known failure",
              S: "– skipped", N: "– n/a", ".": "not in this run"};
  var CLASS = {P: "passed", F: "failed", E: "error", C: "crashed", T: "timeout", X: "unexpected-pass", K: "expected-failure",
               S: "skipped", N: "not-applicable"};
  var BROKEN = "FECTK", HELD = "PX";

  function load(id, done) {
    if (entries[id]) { done(); return; }
    (waiting[id] = waiting[id] || []).push(done);
    if (waiting[id].length > 1) return;
    var script = document.createElement("script");
    script.src = "data/" + id + ".js";
    script.onerror = function () { show([text("p", "cannot load data/" + id + ".js")]); };
    document.body.appendChild(script);
  }
  function text(tag, value, cls) {
    var node = document.createElement(tag);
    node.textContent = value;
    if (cls) node.className = cls;
    return node;
  }
  function link(href, value) { var a = text("a", value); a.href = href; return a; }
  function show(nodes) {
    var result = document.getElementById("result");
    while (result.firstChild) result.removeChild(result.firstChild);
    nodes.forEach(function (n) { result.appendChild(n); });
  }
  function badge(code) { return text("span", WORD[code], "badge o-" + (CLASS[code] || "none")); }
  function item(i, a, b, explain) {
    var li = document.createElement("li");
    li.setAttribute("data-test", keys[i]);
    li.appendChild(text("span", keys[i], "test"));
    li.appendChild(document.createElement("br"));
    [[a, "older"], [b, "newer"]].forEach(function (side, n) {
      var code = side[0].outcomes.charAt(i) || ".", note = side[0].notes[i];
      li.appendChild(document.createTextNode((n ? " → " : "") + side[1] + ": "));
      li.appendChild(badge(code));
      if (note && note.detail) { li.appendChild(document.createTextNode(" ")); li.appendChild(link(note.detail, "detail")); }
    });
    var note = (explain === "after" ? b : a).notes[i] || {};
    if (note.reason || note.why) li.appendChild(text("span", note.reason || note.why, "why"));
    var repro = (b.notes[i] || {}).repro || (a.notes[i] || {}).repro;
    if (repro) li.appendChild(text("code", repro, "repro"));
    return li;
  }
  function section(title, items) {
    var nodes = [text("h2", title + " (" + items.length + ")")];
    if (!items.length) { nodes.push(text("p", "None.")); return nodes; }
    var ul = document.createElement("ul");
    ul.className = "changes";
    items.forEach(function (li) { ul.appendChild(li); });
    return nodes.concat([ul]);
  }
  function compare(aId, bId) {
    var a = entries[aId], b = entries[bId], failing = [], fixed = [], na = [], still = 0;
    for (var i = 0; i < keys.length; i++) {
      var was = a.outcomes.charAt(i) || ".", now = b.outcomes.charAt(i) || ".";
      if (was === "." && now === ".") continue;
      if (BROKEN.indexOf(now) >= 0) { if (BROKEN.indexOf(was) >= 0) still++; else failing.push(item(i, a, b, "after")); }
      else if (BROKEN.indexOf(was) >= 0 && HELD.indexOf(now) >= 0) fixed.push(item(i, a, b, "before"));
      if (now === "N" && was !== "N" && was !== ".") na.push(item(i, a, b, "after"));
    }
    var summary = text("p", failing.length + " newly failing · " + fixed.length + " fixed · " + na.length +
                       " newly not applicable · " + still + " still failing", "count-line");
    summary.id = "diff-summary";
    show([summary].concat(section("Newly failing", failing), section("Fixed", fixed), section("Newly not applicable", na)));
  }
  function pick() {
    var a = document.getElementById("a").value, b = document.getElementById("b").value, left = 2;
    show([text("p", "loading…")]);
    function one() { if (--left === 0) compare(a, b); }
    load(a, one);  // both at once: a page dumped at its load event has both
    load(b, one);
  }
  function start() {
    var params = new URLSearchParams(window.location.search);
    ["a", "b"].forEach(function (side) {
      var select = document.getElementById(side), wanted = params.get(side);
      if (wanted && Array.prototype.some.call(select.options, function (o) { return o.value === wanted; })) select.value = wanted;
      select.addEventListener("change", pick);
    });
    pick();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
  return {
    tests: function (list) { keys = list; },
    entry: function (id, data) {
      entries[id] = data;
      (waiting[id] || []).forEach(function (done) { done(); });
      delete waiting[id];
    }
  };
})();
