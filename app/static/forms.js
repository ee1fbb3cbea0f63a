// A form posted once is sent once. A second click (or Enter) while the page waits for the
// portal's answer sent it again, and the portal did the work twice: a second agent enrolled with
// its attempts, a second attempt, a second invitation. Forms that post within the page (their
// own handler cancels the navigation, as the work page's pause and resume do) are left to it;
// a form stays locked a few seconds only, so that one whose answer leaves the page as it is (a
// download) can be sent again, and is unlocked when the browser shows the page again (back).
(function () {
  "use strict";
  var LOCK_MS = 8000;

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (event.defaultPrevented || !(form instanceof HTMLFormElement)) {
      return;
    }
    if ((form.getAttribute("method") || "get").toLowerCase() !== "post") {
      return;
    }
    if (form.dataset.sending) {
      event.preventDefault();
      return;
    }
    form.dataset.sending = "1";
    setTimeout(function () {
      delete form.dataset.sending;
    }, LOCK_MS);
  });

  window.addEventListener("pageshow", function () {
    document.querySelectorAll("form[data-sending]").forEach(function (form) {
      delete form.dataset.sending;
    });
  });
})();
