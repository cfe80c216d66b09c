/* parallel_mcp admin: the graph's "fit to width" toggle and an optional auto-refresh of a
   detail page. No dependencies, no network. */
(function () {
  "use strict";
  var KEY = "pmcp-autorefresh";

  function init() {
    document.querySelectorAll("[data-pmcp-graph-fit]").forEach(function (button) {
      var frame = document.querySelector(".pmcp-graph-frame");
      if (!frame) { return; }
      button.addEventListener("click", function () {
        var fit = frame.classList.toggle("pmcp-graph-fit");
        button.textContent = fit ? "Actual size" : "Fit to width";
      });
    });
    var boxes = document.querySelectorAll("[data-pmcp-autorefresh]");
    var on = false;
    try { on = window.sessionStorage.getItem(KEY) === "1"; } catch (e) { on = false; }
    boxes.forEach(function (box) {
      box.checked = on;
      box.addEventListener("change", function () {
        try { window.sessionStorage.setItem(KEY, box.checked ? "1" : "0"); } catch (e) { /* private mode */ }
        if (box.checked) { schedule(); }
      });
    });
    if (on && boxes.length) { schedule(); }
  }

  var timer = null;
  function schedule() {
    if (timer) { return; }
    timer = window.setTimeout(function () {
      var still = false;
      try { still = window.sessionStorage.getItem(KEY) === "1"; } catch (e) { still = false; }
      if (still) { window.location.reload(); }
      timer = null;
    }, 5000);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
