// The work page's bar (attempts/work.html): the working clock ticks every second at its rate
// and is set again from the portal's state every few seconds; pause and resume post their forms
// without leaving the page (JupyterLab in the frame stays as it is); a hub that does not answer
// is said in the bar; when the attempt ends, the frame goes and the page says so.
(function () {
  "use strict";
  var body = document.body;
  var stateUrl = body.getAttribute("data-state-url");
  var every = parseInt(body.getAttribute("data-every-ms"), 10) || 3000;
  var working = document.getElementById("working");
  var limit = document.getElementById("limit");
  var status = document.getElementById("work-status");
  var notice = document.getElementById("work-notice");
  var pauseForm = document.getElementById("pause-form");
  var resumeForm = document.getElementById("resume-form");
  var ended = document.getElementById("ended");
  var base = {
    seconds: parseFloat(working.getAttribute("data-seconds")),
    rate: parseFloat(working.getAttribute("data-tick")),
    at: Date.now()
  };
  var timer = null;

  var hours = window.baselineHours;

  function tick() {
    working.textContent = hours(base.seconds + base.rate * (Date.now() - base.at) / 1000);
  }

  function say(text) {
    notice.textContent = text;
    notice.hidden = !text;
  }

  function removeFrame() {
    ["lab", "not-open"].forEach(function (id) {
      var element = document.getElementById(id);
      if (element) {
        element.remove(); // JupyterLab's dialogs and connections go with it
      }
    });
  }

  function end(state) {
    removeFrame();
    var reason = state.end_reason;
    document.getElementById("ended-reason").textContent = reason
      ? reason.charAt(0).toUpperCase() + reason.slice(1) + "."
      : "";
    ended.hidden = false;
    clearInterval(timer);
  }

  function loggedOut() {
    removeFrame();
    base = { seconds: base.seconds, rate: 0, at: Date.now() };
    status.textContent = "logged out";
    pauseForm.hidden = true;
    resumeForm.hidden = true;
    say("You are logged out of the portal, which closed your workspace. Log in to go on.");
    clearInterval(timer);
  }

  function show(state) {
    base = { seconds: state.working_s, rate: state.rate, at: Date.now() };
    tick();
    limit.textContent = hours(state.limit_s);
    status.textContent = state.label;
    body.setAttribute("data-status", state.paused ? "paused" : state.status);
    pauseForm.hidden = !state.can_pause;
    resumeForm.hidden = !state.can_resume;
    say(state.notice);
    if (state.ended) {
      end(state);
    }
  }

  function refresh() {
    return fetch(stateUrl, { credentials: "same-origin", cache: "no-store" })
      .then(function (answer) {
        if (answer.redirected) { // to the login page: this session ended, and the workspace
          loggedOut(); // with it (the portal's logout stops the participant's servers)
          return null;
        }
        if (!answer.ok) {
          throw new Error("the portal answered " + answer.status);
        }
        return answer.json();
      })
      .then(function (state) {
        if (state) {
          show(state);
        }
      })
      .catch(function (error) {
        say("The portal is not answering (" + error.message + "); the clock shown may be late.");
      });
  }

  function post(form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var button = form.querySelector("button");
      button.disabled = true;
      fetch(form.action, { method: "POST", body: new FormData(form), credentials: "same-origin" })
        .then(function (answer) {
          if (!answer.ok) {
            say("Not done: the portal answered " + answer.status + ". Your attempt's page says why.");
          }
          return refresh();
        })
        .finally(function () {
          button.disabled = false;
        });
    });
  }

  post(pauseForm);
  post(resumeForm);
  setInterval(tick, 1000);
  timer = setInterval(refresh, every);
})();
