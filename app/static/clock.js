// The attempt page's clock keeps counting between page loads: each [data-tick] stat moves by its
// rate (working seconds per real second: the attempt's time scale while the clock runs, 0
// otherwise) every second, shown as h:mm:ss like the server renders it. The page itself is the
// truth: a reload shows the stored clock.
(function () {
  "use strict";
  var hours = window.baselineHours;
  var stats = Array.prototype.slice.call(document.querySelectorAll("[data-tick]"));
  var start = Date.now();
  stats.forEach(function (el) {
    el.baseSeconds = parseFloat(el.getAttribute("data-seconds"));
    el.rate = parseFloat(el.getAttribute("data-tick"));
  });
  stats = stats.filter(function (el) { return el.rate !== 0 && !isNaN(el.baseSeconds); });
  if (stats.length) {
    setInterval(function () {
      var elapsed = (Date.now() - start) / 1000;
      stats.forEach(function (el) { el.textContent = hours(el.baseSeconds + el.rate * elapsed); });
    }, 1000);
  }
})();
