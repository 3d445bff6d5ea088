// The console's live parts: counts and lists follow the server's events.
"use strict";
(function () {
  var page = document.body.dataset.page;
  var dot = document.getElementById("live");
  var lastText = null, pending = false;

  // vis writes what a browser would hide or act on as an escape, as the
  // server's pages do.
  function vis(s) {
    return String(s).replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]/g, function (c) {
      var h = c.charCodeAt(0).toString(16);
      return c.charCodeAt(0) < 0x80 ? "\\x" + ("0" + h).slice(-2) : "\\u" + ("000" + h).slice(-4);
    });
  }

  function text(el, s) { if (el && el.textContent !== s) { el.textContent = s; } }

  function secs(s) {
    if (s === null || s === undefined) { return "—"; }
    if (s < 10) { return Math.max(s, 0).toFixed(1) + "s"; }
    var d = Math.floor(s), h = Math.floor(d / 3600), m = Math.floor((d % 3600) / 60), x = d % 60;
    if (h > 0) { return h + "h" + m + "m0s"; }
    return (m > 0 ? m + "m" : "") + x + "s";
  }

  function cell(tr, f) { return tr.querySelector('[data-f="' + f + '"]'); }

  // A queue's name may be anything a writer chose ("__proto__" too): the
  // rows are kept in a Map, and a queue that fails leaves the others live.
  function queues(state) {
    var body = document.querySelector("#queues tbody");
    if (!body) { return; }
    var rows = new Map();
    body.querySelectorAll("tr[data-queue]").forEach(function (tr) { rows.set(tr.dataset.queue, tr); });
    (state.queues || []).forEach(function (q) {
      try { queue(body, rows, q); } catch (e) { /* the next state tries again */ }
    });
  }

  function queue(body, rows, q) {
    var tr = rows.get(q.queue);
    if (!tr) {
      var empty = body.querySelector("tr.empty");
      if (empty) { empty.remove(); }
      tr = document.createElement("tr");
      tr.dataset.queue = q.queue;
      ["queue", "pending", "due", "running", "lag", "done_last_minute", "dead_last_minute", "chart", "", "", "", "paused"].forEach(function (f, i) {
        var td = document.createElement("td");
        if (i > 0 && i < 11 && f !== "chart") { td.className = "n"; }
        if (f && f !== "queue" && f !== "chart") { td.dataset.f = f; }
        if (f === "queue") { td.textContent = vis(q.queue); }
        tr.appendChild(td);
      });
      body.appendChild(tr);
      rows.set(q.queue, tr);
    }
    text(cell(tr, "pending"), String(q.pending));
    text(cell(tr, "due"), String(q.due));
    text(cell(tr, "running"), String(q.running));
    text(cell(tr, "lag"), secs(q.oldest_due_seconds));
    text(cell(tr, "done_last_minute"), String(q.done_last_minute));
    text(cell(tr, "dead_last_minute"), String(q.dead_last_minute));
    var badge = cell(tr, "paused") && cell(tr, "paused").querySelector(".badge");
    if (badge) {
      text(badge, q.paused ? "paused" : "active");
      badge.className = "badge " + (q.paused ? "paused" : "active");
    }
  }

  function workers(state) {
    var body = document.querySelector("#workers tbody");
    if (!body) { return; }
    var list = state.workers || [];
    body.replaceChildren();
    if (list.length === 0) {
      var tr = document.createElement("tr"), td = document.createElement("td");
      tr.className = "empty"; td.colSpan = 4; td.textContent = "No worker runs a job.";
      tr.appendChild(td); body.appendChild(tr);
      return;
    }
    list.forEach(function (w) {
      var tr = document.createElement("tr");
      var name = document.createElement("td"); name.textContent = vis(w.name);
      var n = document.createElement("td"); n.className = "n"; n.textContent = String(w.running);
      var jobs = document.createElement("td");
      (w.jobs || []).forEach(function (j) {
        var a = document.createElement("a");
        a.href = "/jobs/" + encodeURIComponent(String(j.id));
        a.textContent = String(j.id);
        jobs.appendChild(a);
        jobs.appendChild(document.createTextNode(" " + vis(j.kind) + " "));
      });
      var lease = document.createElement("td"); lease.textContent = String(w.lease_until).replace("T", " ").slice(0, 23);
      tr.append(name, n, jobs, lease);
      body.appendChild(tr);
    });
  }

  // The jobs list reloads its rows when the state changed, unless the
  // operator is selecting rows or reading a later page.
  function jobs() {
    var table = document.getElementById("jobs");
    if (!table || table.dataset.first !== "1" || pending) { return; }
    if (document.querySelector('#rows input[type="checkbox"]:checked')) { return; }
    var u = new URL(window.location.href);
    u.searchParams.delete("msg");
    u.searchParams.delete("sig");
    u.searchParams.set("fragment", "1");
    pending = true;
    fetch(u.toString(), { credentials: "same-origin" }).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (html) {
      pending = false;
      if (html !== null && !document.querySelector('#rows input[type="checkbox"]:checked')) {
        document.getElementById("rows").innerHTML = html; // rendered and escaped by the server
      }
    }).catch(function () { pending = false; });
  }

  var all = document.getElementById("all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll('#rows input[type="checkbox"]').forEach(function (c) { c.checked = all.checked; });
    });
  }

  if (!window.EventSource) { return; }
  var es = new EventSource("/events");
  es.addEventListener("open", function () { if (dot) { dot.className = "live on"; } });
  es.addEventListener("error", function () { if (dot) { dot.className = "live off"; } });
  es.addEventListener("state", function (ev) {
    var state;
    try { state = JSON.parse(ev.data); } catch (e) { return; }
    if (state.error) { if (dot) { dot.className = "live off"; dot.title = state.error; } return; }
    if (dot) { dot.className = "live on"; dot.title = "live updates"; }
    if (page === "overview") { queues(state); workers(state); }
    if (page === "jobs") {
      var key = JSON.stringify([state.max_id, state.queues]);
      if (lastText !== null && key !== lastText) { jobs(); }
      lastText = key;
    }
  });
  document.body.dataset.live = "1";
})();
