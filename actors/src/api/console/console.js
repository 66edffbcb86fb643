// Kairos console: live regions and the schedule preview. No framework, no build step.
// Elements with data-live are re-read from the server every 2 s (while the tab is visible)
// and replaced in place; forms with data-confirm ask first; the schedule form's preview
// follows what is typed.
(function () {
  "use strict";
  function refresh() {
    var live = document.querySelectorAll("[data-live]");
    if (!live.length || document.hidden) return;
    fetch(location.href, { credentials: "same-origin", headers: { "X-Kairos-Live": "1" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        live.forEach(function (el) {
          var fresh = el.id && doc.getElementById(el.id);
          if (fresh && fresh.innerHTML !== el.innerHTML) el.innerHTML = fresh.innerHTML;
        });
      })
      .catch(function () {});
  }
  setInterval(refresh, 2000);

  document.addEventListener("submit", function (ev) {
    var msg = ev.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });

  var form = document.querySelector("form[data-preview]");
  if (form) {
    var out = document.getElementById("preview");
    var timer = null;
    var update = function () {
      var q = new URLSearchParams();
      ["expression", "timezone"].forEach(function (n) {
        var f = form.elements[n];
        if (f) q.set(n, f.value);
      });
      fetch(form.getAttribute("data-preview") + "?" + q.toString(), { credentials: "same-origin" })
        .then(function (r) { return r.text(); })
        .then(function (html) { out.innerHTML = html; })
        .catch(function () {});
    };
    form.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(update, 300);
    });
  }
})();
