// Baseline's JupyterLab extension, written by hand in the shape `jupyter labextension build`
// gives a prebuilt extension (a module-federation container: `init` receives the shared modules,
// `get` returns a module factory), so the workspace image needs no JavaScript build.
//
// One plugin: the handler of a lost connection to the server. JupyterHub's own
// (@jupyterlab/hub-extension:connectionlost, disabled in package.json) asks "Server unavailable
// or unreachable ... Would you like to restart it?" whenever a request fails, which is what a
// hub restart does to every open JupyterLab for a second or two: the server is still running,
// and "Restart" would only lead the participant astray. JupyterLab's fallback dialog ("Server
// Connection Error") is no better. This handler shows nothing: JupyterLab keeps retrying on its
// own, and the portal's work page, around this JupyterLab, says that it is reconnecting.
(function () {
  "use strict";
  var shared = null;

  function sharedModule(name) {
    var versions = shared && shared[name];
    if (!versions) {
      return Promise.reject(new Error(name + " is not shared by this JupyterLab"));
    }
    var keys = Object.keys(versions);
    var loaded = keys.filter(function (v) { return versions[v].loaded; });
    var chosen = loaded.length ? loaded[0] : keys[0];
    return Promise.resolve(versions[chosen].get()).then(function (factory) {
      return factory();
    });
  }

  function plugins(application) {
    return [
      {
        id: "baseline-lab:connectionlost",
        description: "A lost connection to the server shows no dialog (the portal says it).",
        autoStart: true,
        provides: application.IConnectionLost,
        activate: function () {
          return function () {
            console.info("baseline-lab: the server is not answering; JupyterLab retries");
            return Promise.resolve();
          };
        }
      }
    ];
  }

  window._JUPYTERLAB = window._JUPYTERLAB || {};
  window._JUPYTERLAB["baseline-lab"] = {
    init: function (shareScope) {
      shared = shareScope;
    },
    get: function (module) {
      if (module !== "./extension") {
        return Promise.reject(new Error("baseline-lab has no module " + module));
      }
      return sharedModule("@jupyterlab/application").then(function (application) {
        return function () {
          return { __esModule: true, default: plugins(application) };
        };
      });
    }
  };
})();
