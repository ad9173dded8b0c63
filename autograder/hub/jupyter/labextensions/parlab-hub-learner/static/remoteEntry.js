// Parallelism Lab's JupyterLab extension for learners on the hub (autograder/hub/README.md,
// "What each learner gets"), on their servers' JUPYTER_PATH when nbgrader's exchange is on.
//
// 1. On arrival, when nothing of the learner's is open (no widget in the main area but a
//    Launcher), it opens nbgrader's Assignment List (Fetch, Submit, Fetch Feedback).
// 2. nbgrader's "(view feedback)" link only runs `filebrowser:go-to-path` on the feedback
//    folder (feedback/<time>/), which shows the folder; when that command runs on such a
//    folder, this opens each feedback page in it (.html) in JupyterLab's HTML viewer.
//
// Written by hand, with no build step. JupyterLab loads a prebuilt ("federated") extension by
// running this file (package.json's jupyterlab._build.load), which must define
// window._JUPYTERLAB[<package name>] with webpack's container interface: init(shareScope)
// and get("./extension"), a promise of a factory whose result's default export is the list
// of plugins. The plugin needs no shared package (only the application object JupyterLab
// passes to activate: its commands, shell and contents service), so init has nothing to do.
(function () {
  "use strict";
  var NAME = "parlab-hub-learner";
  var ASSIGNMENT_LIST = "nbgrader:open-assignment-list";
  var FEEDBACK_FOLDER = /(^|\/)feedback\/[^/]+\/?$/;

  function nothingOpen(app) {
    for (var widget of app.shell.widgets("main")) {
      if (!String(widget.id).startsWith("launcher")) {
        return false;
      }
    }
    return true;
  }

  function openFeedbackPages(app, folder) {
    return app.serviceManager.contents.get(folder, { content: true }).then(function (model) {
      (model.content || []).forEach(function (item) {
        if (item.type === "file" && /\.html$/.test(item.name)) {
          app.commands.execute("docmanager:open", { path: item.path, factory: "HTML Viewer" });
        }
      });
    });
  }

  var plugin = {
    id: NAME + ":plugin",
    description: "The Assignment List on arrival; (view feedback) opens the feedback page.",
    autoStart: true,
    activate: function (app) {
      app.restored.then(function () {
        if (nothingOpen(app) && app.commands.hasCommand(ASSIGNMENT_LIST)) {
          return app.commands.execute(ASSIGNMENT_LIST);
        }
      });
      app.commands.commandExecuted.connect(function (_, executed) {
        var path = String((executed.args || {}).path || "");
        if (executed.id === "filebrowser:go-to-path" && FEEDBACK_FOLDER.test(path)) {
          openFeedbackPages(app, path.replace(/\/$/, "")).catch(function (err) {
            console.warn(NAME + ": could not open the feedback in " + path, err);
          });
        }
      });
    }
  };

  var containers = (window._JUPYTERLAB = window._JUPYTERLAB || {});
  containers[NAME] = {
    init: function () {
      return Promise.resolve();
    },
    get: function (module) {
      if (module !== "./extension") {
        return Promise.reject(new Error(NAME + " has no module " + module));
      }
      return Promise.resolve(function () {
        return { __esModule: true, default: [plugin] };
      });
    }
  };
})();
