// ledger web: live fragments. The page listens to /events (server-sent events); each change
// names the marks that moved, and every element whose data-on lists one of them is fetched
// again (?fragment=NAME of this page's URL) and replaced. No framework, no inline script.
(function () {
  "use strict";
  var state = document.getElementById("live-state");
  var sections = Array.prototype.slice.call(document.querySelectorAll("[data-fragment][data-on]"));
  if (!sections.length || !window.EventSource) { return; }
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

  var source = new EventSource("/events");
  source.addEventListener("open", function () {
    if (state) { state.textContent = "●"; state.className = "live on"; }
  });
  source.addEventListener("error", function () {
    if (state) { state.textContent = "○"; state.className = "live"; }
  });
  source.addEventListener("change", function (event) {
    var changed = [];
    try { changed = JSON.parse(event.data); } catch (e) { return; }
    sections.forEach(function (section) {
      var wants = (section.getAttribute("data-on") || "").split(/\s+/);
      if (wants.some(function (mark) { return changed.indexOf(mark) >= 0; })) { refresh(section); }
    });
  });
})();
