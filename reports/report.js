// gradcheck HTML report: sortable, filterable per-leaf tables and the copy buttons.
// The data comes from the JSON block the renderer embeds; every string from it
// reaches the page through textContent, never innerHTML, so a hostile layer
// name stays text.
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("gradcheck-data").textContent);
  var RANK = {};
  DATA.verdicts.forEach(function (v, i) { RANK[v] = i; });
  var FAILING = {};
  DATA.failing.forEach(function (v) { FAILING[v] = true; });
  var SYMBOL = DATA.symbols;

  // Non-finite numbers travel as strings ("inf", "nan") because JSON has no literal for them.
  function num(x) {
    if (x === null || x === undefined) return NaN;
    if (typeof x === "number") return x;
    if (x === "inf") return Infinity;
    if (x === "-inf") return -Infinity;
    return NaN;
  }

  // Mirrors _common.fmt so the table and the cards print the same digits.
  function fmt(x) {
    if (x === null || x === undefined) return "\u2014";
    var v = num(x);
    if (isNaN(v)) return "NaN";
    if (!isFinite(v)) return v > 0 ? "inf" : "-inf";
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e-3 && a < 1e4) return String(Number(v.toPrecision(3)));
    var s = v.toExponential(2).replace(/\.?0+e/, "e").replace("e+", "e+0").replace("e-", "e-0");
    return s.replace(/e([+-])0*(\d\d)/, "e$1$2");
  }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function badge(v) {
    var known = Object.prototype.hasOwnProperty.call(RANK, v);
    return el("span", "badge v-" + (known ? v : "unknown"), (SYMBOL[v] || "?") + " " + v);
  }

  function isFailing(v) {
    return FAILING[v] === true || !Object.prototype.hasOwnProperty.call(RANK, v);
  }

  function rowFor(r) {
    var tr = el("tr", isFailing(r.v) ? "bad" : "");
    tr.dataset.verdict = r.v;
    tr.appendChild(el("td", "n muted", String(r.i + 1)));
    var path = el("td", "path");
    if (r.anchor) {
      var a = el("a", "", r.p);
      a.setAttribute("href", "#" + r.anchor);
      path.appendChild(a);
    } else {
      path.textContent = r.p;
    }
    tr.appendChild(path);
    tr.appendChild(el("td", "muted", r.l || "\u2014"));
    tr.appendChild(el("td", "muted", r.s));
    var vc = el("td");
    vc.appendChild(badge(r.v));
    tr.appendChild(vc);
    tr.appendChild(el("td", r.b.length ? "blame" : "muted", r.b.length ? r.b.join(", ") : "\u2014"));
    tr.appendChild(el("td", "n" + (num(r.h) > 1 ? " over" : ""), fmt(r.h)));
    tr.appendChild(el("td", "n", fmt(r.a)));
    tr.appendChild(el("td", "n", fmt(r.x)));
    return tr;
  }

  var KEYS = {
    i: function (r) { return r.i; },
    p: function (r) { return r.p; },
    l: function (r) { return r.l; },
    v: function (r) { var k = RANK[r.v]; return k === undefined ? -1 : k; },
    b: function (r) { return r.b.join(","); },
    h: function (r) { return num(r.h); },
    a: function (r) { return num(r.a); },
    x: function (r) { return num(r.x); }
  };
  // Numbers first show the largest (the worst); verdicts the worst (rank 0) first.
  var DESC_FIRST = { h: true, a: true, x: true };

  function compare(key, dir) {
    var get = KEYS[key];
    return function (p, q) {
      var a = get(p.r), b = get(q.r);
      // Missing numbers (no pair compared) always sink to the bottom.
      var an = typeof a === "number" && isNaN(a), bn = typeof b === "number" && isNaN(b);
      if (an || bn) return an === bn ? p.r.i - q.r.i : (an ? 1 : -1);
      var c = typeof a === "string" ? a.localeCompare(b) : (a < b ? -1 : a > b ? 1 : 0);
      return c !== 0 ? c * dir : p.r.i - q.r.i;
    };
  }

  function setup(box) {
    var data = DATA.cases[Number(box.dataset.case)];
    if (!data) return;
    var tbody = box.querySelector("tbody");
    var shown = box.querySelector(".shown");
    var items = data.rows.map(function (r) { return { r: r, tr: rowFor(r) }; });
    var state = { key: "i", dir: 1 };
    var controls = {
      verdict: box.querySelector("[data-f=verdict]"),
      blame: box.querySelector("[data-f=blame]"),
      text: box.querySelector("[data-f=text]"),
      failing: box.querySelector("[data-f=failing]")
    };

    function apply() {
      var v = controls.verdict.value, b = controls.blame.value;
      var t = controls.text.value.trim().toLowerCase(), f = controls.failing.checked;
      var count = 0;
      items.slice().sort(compare(state.key, state.dir)).forEach(function (it) {
        var r = it.r;
        var ok = (!v || r.v === v) && (!b || r.b.indexOf(b) >= 0) && (!f || isFailing(r.v)) &&
          (!t || r.p.toLowerCase().indexOf(t) >= 0 || (r.l || "").toLowerCase().indexOf(t) >= 0);
        it.tr.hidden = !ok;
        if (ok) count += 1;
        tbody.appendChild(it.tr);
      });
      shown.textContent = count + " of " + items.length + " leaves shown";
      box.querySelectorAll("th[data-k]").forEach(function (th) {
        th.setAttribute("aria-sort", th.dataset.k === state.key ? (state.dir > 0 ? "ascending" : "descending") : "none");
      });
    }

    box.querySelectorAll("th[data-k] button").forEach(function (button) {
      button.addEventListener("click", function () {
        var key = button.parentNode.dataset.k;
        if (state.key === key) state.dir = -state.dir;
        else { state.key = key; state.dir = DESC_FIRST[key] ? -1 : 1; }
        apply();
      });
    });
    ["verdict", "blame", "failing"].forEach(function (k) { controls[k].addEventListener("change", apply); });
    controls.text.addEventListener("input", apply);
    apply();
  }

  document.querySelectorAll(".leaftable[data-case]").forEach(setup);

  // Copy buttons: the clipboard API is refused on some file:// pages; select the text instead.
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var target = document.getElementById(button.dataset.copy);
      if (!target) return;
      var text = target.textContent;
      function selectIt() {
        var range = document.createRange();
        range.selectNodeContents(target);
        var sel = window.getSelection();
        sel.removeAllRanges();
        sel.addRange(range);
        button.textContent = "Selected";
      }
      try {
        navigator.clipboard.writeText(text).then(function () { button.textContent = "Copied"; }, selectIt);
      } catch (err) {
        selectIt();
      }
    });
  });

  // Following a link to a collapsed card opens it (and the case it sits in).
  function openTarget() {
    var id;
    try {
      id = decodeURIComponent(location.hash.slice(1));
    } catch (err) {
      return; // a malformed hash typed by hand: nothing to open
    }
    var node = id && document.getElementById(id);
    for (var n = node; n; n = n.parentElement) {
      if (n.tagName === "DETAILS") n.open = true;
    }
    if (node) node.scrollIntoView({ block: "start" });
  }
  window.addEventListener("hashchange", openTarget);
  if (location.hash) openTarget();
})();
