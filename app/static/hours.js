// Working time as h:mm:ss, as the server renders it (`fmt_hours`): shared by the attempt page's
// clock (clock.js) and the work page's bar (work.js), which load this first.
window.baselineHours = function (seconds) {
  "use strict";
  var total = Math.max(0, Math.round(seconds));
  var h = Math.floor(total / 3600);
  var m = Math.floor((total % 3600) / 60);
  var s = total % 60;
  return h + ":" + (m < 10 ? "0" : "") + m + ":" + (s < 10 ? "0" : "") + s;
};
