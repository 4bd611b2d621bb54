// Turnstile inbox: live updates on top of pages that work without this script.
(function () {
  "use strict";

  var live = document.getElementById("live");

  function announce(text) {
    if (live) {
      live.textContent = "";
      window.setTimeout(function () { live.textContent = text; }, 50);
    }
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (response.status === 401) { throw new Error("signed-out"); }
        if (!response.ok) { throw new Error("status " + response.status); }
        return response.json();
      });
  }

  function signedOut() {
    announce("Your session ended. Reload the page to sign in again.");
  }

  function every(seconds, task) {
    var delay = Math.max(0.5, Number(seconds) || 3) * 1000;
    var stopped = false;
    function tick() {
      if (stopped) { return; }
      if (document.hidden) { window.setTimeout(tick, delay); return; }
      task().then(function (goOn) {
        if (goOn === false) { stopped = true; return; }
        window.setTimeout(tick, delay);
      }, function (error) {
        if (error && error.message === "signed-out") {
          signedOut();
          stopped = true;
          return;
        }
        window.setTimeout(tick, delay * 2);
      });
    }
    window.setTimeout(tick, delay);
  }

  // What the page refreshes: each task is run when the server says something changed
  // (server-sent events), or every few seconds when the event stream is not available.
  var refreshers = [];
  var polling = false;

  function refresh(seconds, task) {
    refreshers.push({ seconds: seconds, task: task, stopped: false });
  }

  function pollAll() {
    if (polling) { return; }
    polling = true;
    refreshers.forEach(function (r) { if (!r.stopped) { every(r.seconds, r.task); } });
  }

  function refreshAll() {
    refreshers.forEach(function (r) {
      if (r.stopped) { return; }
      r.task().then(function (goOn) {
        if (goOn === false) { r.stopped = true; }
      }, function (error) {
        if (error && error.message === "signed-out") { r.stopped = true; signedOut(); }
      });
    });
  }

  function listen() {
    var url = document.body.getAttribute("data-events-url");
    if (!refreshers.length) { return; }
    if (!url || !window.EventSource) { pollAll(); return; }
    var source = new window.EventSource(url);
    // Changes made between the page's rendering and the stream's opening, or while it
    // reconnects, were announced to nobody: look once whenever it opens.
    source.addEventListener("open", refreshAll);
    source.addEventListener("change", refreshAll);
    source.addEventListener("signed-out", function () { source.close(); signedOut(); });
    source.addEventListener("error", function () {
      // Closed for good (no notifications on this server, signed out, or unreachable):
      // poll instead, as a page does without this stream.
      if (source.readyState === window.EventSource.CLOSED) { pollAll(); }
    });
  }

  // Times are written in UTC by the server; show them in the reader's time zone.
  function localTimes(root) {
    var times = root.querySelectorAll("time[data-local]");
    for (var i = 0; i < times.length; i++) {
      var when = new Date(times[i].getAttribute("datetime"));
      if (!isNaN(when.getTime())) {
        times[i].title = times[i].textContent;
        times[i].textContent = when.toLocaleString();
      }
    }
  }

  function inboxIds(body) {
    var ids = [];
    var rows = body.querySelectorAll("tr[data-approval]");
    for (var i = 0; i < rows.length; i++) { ids.push(rows[i].getAttribute("data-approval")); }
    return ids;
  }

  function liveInbox(table) {
    var body = document.getElementById("inbox-rows");
    var count = document.getElementById("inbox-count");
    var swapRows = table.getAttribute("data-live-rows") !== "off";
    var shown = inboxIds(body);
    var shownKey = table.getAttribute("data-live-key");
    refresh(table.getAttribute("data-live-seconds"), function () {
      return getJSON(table.getAttribute("data-live-url")).then(function (data) {
        var before = count.textContent;
        count.textContent = data.countText;
        count.setAttribute("aria-label", data.countText + " open approvals");
        document.title = "(" + data.countText + ") Inbox · Turnstile";
        // Also swapped when only a vote count or who holds an approval changed.
        if (swapRows && (data.ids.join("\n") !== shown.join("\n") || data.key !== shownKey)) {
          var fresh = data.ids.filter(function (id) { return shown.indexOf(id) < 0; });
          body.innerHTML = data.rows;
          var rows = body.querySelectorAll("tr[data-approval]");
          for (var i = 0; i < rows.length; i++) {
            if (fresh.indexOf(rows[i].getAttribute("data-approval")) >= 0) { rows[i].classList.add("new"); }
          }
          shown = data.ids;
          shownKey = data.key;
          if (fresh.length) {
            announce(fresh.length === 1 ? "1 new approval." : fresh.length + " new approvals.");
          }
        } else if (before !== data.countText) {
          announce(data.countText + " open approvals.");
        }
      });
    });
  }

  // A page showing something still in motion reloads once its state changes.
  function watch(element) {
    var known = element.getAttribute("data-watch-state");
    refresh(element.getAttribute("data-watch-seconds"), function () {
      return getJSON(element.getAttribute("data-watch-url")).then(function (data) {
        if (known === null) { known = data.state; return true; }
        if (data.state !== known) { window.location.reload(); return false; }
        return true;
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    localTimes(document);
    var table = document.querySelector("table[data-live-url]");
    if (table) { liveInbox(table); }
    var watched = document.querySelectorAll("[data-watch-url]");
    for (var i = 0; i < watched.length; i++) { watch(watched[i]); }
    listen();
    var focus = document.querySelector("[data-focus]");
    if (focus) { focus.focus(); }
  });
})();
