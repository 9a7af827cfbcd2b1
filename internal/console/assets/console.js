// tokenserver console: live figures and charts. Vanilla JS, no build step.
// Pages work without it; it polls the console's own endpoints under /ui/.
(function () {
  "use strict";

  var readyParts = 0;
  // ready marks the page done (tests and the load-time figure read it).
  function ready() {
    readyParts--;
    if (readyParts <= 0 && !document.body.dataset.ready) {
      window.consoleReadyAt = performance.now();
      document.body.dataset.ready = "1";
    }
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (r.status === 401) { window.location.assign("/ui/login?reason=expired"); throw new Error("signed out"); }
      return r.json().then(function (body) {
        if (!r.ok) { throw new Error(body.error || r.statusText); }
        return body;
      });
    });
  }

  // every calls f every ms while the page is visible, and at once if now.
  function every(ms, f, now) {
    var busy = false;
    function tick() {
      if (busy || document.hidden) { return; }
      busy = true;
      Promise.resolve(f()).catch(function () {}).then(function () { busy = false; });
    }
    setInterval(tick, ms);
    if (now) { tick(); }
  }

  function color(name) {
    return getComputedStyle(document.body).getPropertyValue(name).trim() || "#888";
  }

  // Fragments: [data-refresh] elements reload their HTML from the server.
  function refreshers() {
    document.querySelectorAll("[data-refresh]").forEach(function (el) {
      every(Number(el.dataset.interval) || 5000, function () {
        return fetch(el.dataset.refresh, { credentials: "same-origin" }).then(function (r) {
          if (!r.ok) { return; }
          return r.text().then(function (html) { el.innerHTML = html; });
        });
      }, false);
    });
  }

  // Rules page: live cells, sparklines drawn only for visible rows.
  function rulesPage(table) {
    var rows = {};
    table.querySelectorAll("tbody tr[data-rule]").forEach(function (tr) { rows[tr.dataset.rule] = tr; });
    var spark = {}, plots = new WeakMap(), visible = new Set(), loaded = false, observed = false;
    var filter = document.getElementById("filter");
    if (filter) {
      filter.addEventListener("input", function () {
        var q = filter.value.toLowerCase();
        Object.keys(rows).forEach(function (name) { rows[name].hidden = q !== "" && name.toLowerCase().indexOf(q) < 0; });
      });
    }
    function draw(tr) {
      var d = spark[tr.dataset.rule];
      if (!d || !window.uPlot) { return; }
      var xs = d.map(function (_, i) { return i; });
      var cell = tr.querySelector(".spark"), u = plots.get(cell);
      if (u) { u.setData([xs, d]); return; }
      u = new uPlot({
        width: 120, height: 28, pxAlign: false, cursor: { show: false }, legend: { show: false }, select: { show: false },
        scales: { x: { time: false } }, axes: [{ show: false }, { show: false }],
        series: [{}, { stroke: color("--accent"), fill: color("--accent-soft"), width: 1, points: { show: false } }]
      }, [xs, d], cell);
      plots.set(cell, u);
    }
    var io = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { visible.add(e.target); draw(e.target); } else { visible.delete(e.target); }
      });
      if (!observed) { observed = true; if (loaded) { ready(); } }
    });
    Object.keys(rows).forEach(function (n) { io.observe(rows[n]); });
    if (Object.keys(rows).length === 0) { observed = true; }
    readyParts++;
    var first = true;
    every(Number(table.dataset.interval) || 5000, function () {
      var t0 = performance.now();
      return getJSON(table.dataset.api).then(function (body) {
        if (first) { window.consoleFetchMs = performance.now() - t0; }
        body.rules.forEach(function (r) {
          var tr = rows[r.name];
          if (!tr) { return; }
          spark[r.name] = r.spark || [];
          tr.querySelectorAll("[data-f]").forEach(function (td) { td.textContent = r.text[Number(td.dataset.f)]; });
        });
        visible.forEach(draw);
        loaded = true;
        if (first) { first = false; if (observed) { ready(); } }
      });
    }, true);
  }

  // Rule page: a live chart of the last five minutes, one poll a second.
  function ruleChart(el) {
    var now = document.getElementById("chart-now"), u = null;
    var dark = window.matchMedia("(prefers-color-scheme: dark)");
    // The chart's colours are fixed when it is made: remake it when the
    // colour scheme changes.
    dark.addEventListener("change", function () { if (u) { u.destroy(); u = null; } });
    window.addEventListener("resize", function () { if (u) { u.setSize(size()); } });
    readyParts++;
    var first = true;
    function size() { return { width: Math.max(300, el.clientWidth), height: 260 }; }
    every(Number(el.dataset.interval) || 1000, function () {
      return getJSON(el.dataset.api).then(function (s) {
        var data = [s.t, s.admitted, s.denied, s.shadowDenied];
        if (!u) {
          var o = size();
          u = new uPlot({
            width: o.width, height: o.height,
            series: [{}, { label: "admitted/s", stroke: color("--ok"), width: 2 },
              { label: "denied/s", stroke: color("--bad"), width: 2 },
              { label: "shadow-denied/s", stroke: color("--warn"), width: 1, dash: [4, 4] }],
            axes: [{ stroke: color("--fg"), grid: { stroke: color("--grid") } }, { stroke: color("--fg"), grid: { stroke: color("--grid") } }]
          }, data, el);
          el.dataset.scheme = dark.matches ? "dark" : "light";
        } else {
          u.setData(data);
        }
        var n = s.t.length;
        el.dataset.points = String(n);
        el.dataset.last = n ? String(s.t[n - 1]) : "";
        if (n) {
          now.textContent = "Last second: " + s.admitted[n - 1] + " admitted, " + s.denied[n - 1] + " denied, " +
            s.shadowDenied[n - 1] + " shadow-denied; utilisation " + (s.util[n - 1] * 100).toFixed(1) + "%.";
        } else {
          now.textContent = "No decisions in the last five minutes.";
        }
        if (first) { first = false; ready(); }
      }).catch(function (e) { now.textContent = "Live data unavailable: " + e.message; throw e; });
    }, true);
  }

  function start() {
    window.consoleStartAt = performance.now();
    readyParts++;
    refreshers();
    var rules = document.getElementById("rules");
    if (rules && rules.dataset.api) { rulesPage(rules); }
    var chart = document.getElementById("chart");
    if (chart && chart.dataset.api) { ruleChart(chart); }
    ready();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
