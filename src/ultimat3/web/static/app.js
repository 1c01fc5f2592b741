// Keeps a dashboard page live: every few seconds the page's <main> is fetched again (the server
// renders only that part when asked with X-Partial: 1) and swapped in. Nothing from the database
// is ever evaluated: the server escapes every value, and the Content-Security-Policy allows no
// inline script. A form being filled in is never overwritten.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  var badge = document.getElementById("live");
  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
  if (!main) return;
  var every = Number(main.getAttribute("data-live")) || 2000;
  var busy = false;
  function typing() {
    var active = document.activeElement;
    return active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
  }
  function refresh() {
    if (busy || document.hidden || typing()) return;
    busy = true;
    fetch(window.location.href, { headers: { "X-Partial": "1" }, credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) throw new Error(String(response.status));
        return response.text();
      })
      .then(function (html) {
        if (!typing()) main.innerHTML = html;
        if (badge) { badge.className = "live"; badge.title = "updated " + new Date().toLocaleTimeString(); }
        main.setAttribute("data-updated", String(Date.now()));
      })
      .catch(function () { if (badge) { badge.className = "live stale"; badge.title = "cannot reach the server"; } })
      .then(function () { busy = false; });
  }
  window.setInterval(refresh, every);
})();
