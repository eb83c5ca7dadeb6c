// ledger web: live fragments. The page listens to /events (server-sent events); each change
// names the marks that moved, and every element whose data-on lists one of them is fetched
// again (?fragment=NAME of this page's URL) and replaced. No framework, no inline script.
// The stream is held by a worker (live-worker.js), not by the page: a request the page keeps
// open stops a headless browser's virtual time (--virtual-time-budget), so a screenshot tool
// pointed at a live page never finished; a worker's request does not hold the page's clock.
(function () {
  "use strict";
  var state = document.getElementById("live-state");
  var sections = Array.prototype.slice.call(document.querySelectorAll("[data-fragment][data-on]"));
  if (!sections.length || !window.Worker) { return; }
  var busy = {};
  var again = {};

  function refresh(section) {
    var name = section.getAttribute("data-fragment");
    if (busy[name]) { again[name] = true; return; }
    busy[name] = true;
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", name);
    fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html !== null) { section.innerHTML = html; }  // our own server's escaped HTML
        section.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () {})
      .then(function () {
        busy[name] = false;
        if (again[name]) { again[name] = false; refresh(section); }
      });
  }

  var worker = new Worker("/static/live-worker.js");
  worker.addEventListener("message", function (message) {
    var said = message.data;
    if (said.kind !== "change") {  // "open" or "error": the stream is up, or down (it reconnects)
      var on = said.kind === "open";
      if (state) { state.textContent = on ? "●" : "○"; state.className = on ? "live on" : "live"; }
      return;
    }
    var changed = [];
    try { changed = JSON.parse(said.data); } catch (e) { return; }
    sections.forEach(function (section) {
      var wants = (section.getAttribute("data-on") || "").split(/\s+/);
      if (wants.some(function (mark) { return changed.indexOf(mark) >= 0; })) { refresh(section); }
    });
  });
})();
