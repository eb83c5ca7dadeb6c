// ledger web: the page's event stream, held here (see ledger.js): each event is passed on to the
// page as {kind: "open" | "error" | "change", data}.
(function () {
  "use strict";
  if (!self.EventSource) { return; }
  var source = new EventSource("/events");
  source.addEventListener("open", function () { postMessage({ kind: "open" }); });
  source.addEventListener("error", function () { postMessage({ kind: "error" }); });
  source.addEventListener("change", function (event) { postMessage({ kind: "change", data: event.data }); });
})();
