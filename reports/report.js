// gradcheck HTML report: sortable, filterable per-leaf tables and the copy buttons.
// The data comes from the JSON block the renderer embeds; every string from it
// reaches the page through textContent, never innerHTML, so a hostile layer
// name stays text.
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("gradcheck-data").textContent);
  var RANK = {};
  DATA.verdicts.forEach(function (v, i) { RANK[v] = i; });
  var F32RANK = {};
  DATA.f32verdicts.forEach(function (v, i) { F32RANK[v] = i; });
  var SYMBOL = DATA.symbols;
  // Float32Result verdicts share the verdict colours: "ok" looks like agreement, "unmeasured" like a skip.
  var F32CLASS = { ok: "agree", unmeasured: "skipped" };
  var F32SYMBOL = { ok: "\u2713", unmeasured: "\u2013" };

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

  function f32badge(v) {
    var cls = F32CLASS[v] || v;
    var known = Object.prototype.hasOwnProperty.call(RANK, cls);
    return el("span", "badge f32 v-" + (known ? cls : "unknown"), (F32SYMBOL[v] || SYMBOL[v] || "?") + " " + v);
  }

  // One rule for failing leaves, decided in Python (LeafResult.failing): a vacuous leaf is not one.
  function isFailing(r) { return r.F === true; }

  function numCell(x, over) { return el("td", "n" + (over ? " over" : ""), fmt(x)); }

  // Cell renderers by column key (the th's data-k); "e:<backend>" is that backend's float32 error.
  var CELL = {
    i: function (r) { return el("td", "n muted", String(r.i + 1)); },
    p: function (r) {
      var td = el("td", "path");
      if (r.anchor) {
        var a = el("a", "", r.p);
        a.setAttribute("href", "#" + r.anchor);
        td.appendChild(a);
      } else {
        td.textContent = r.p;
      }
      return td;
    },
    l: function (r) { return el("td", "muted", r.l || "\u2014"); },
    s: function (r) { return el("td", "muted", r.s); },
    v: function (r) { var td = el("td"); td.appendChild(badge(r.v)); return td; },
    b: function (r) {
      var td = el("td", r.b.length ? "blame" : "muted", r.b.length ? r.b.join(", ") : "\u2014");
      // A leaf that disagrees only because a layer after it is wrong (CaseResult.origin) says so.
      if (r.n) td.appendChild(el("span", "muted small", " (inherited)"));
      return td;
    },
    h: function (r) { return numCell(r.h, num(r.h) > 1); },
    a: function (r) { return numCell(r.a); },
    x: function (r) { return numCell(r.x); },
    f: function (r) {
      var td = el("td");
      if (r.f) td.appendChild(f32badge(r.f)); else td.textContent = "\u2014";
      return td;
    },
    q: function (r) { var td = numCell(r.q, r.w.length > 0); if (r.q !== null) td.textContent += "\u00d7"; return td; },
    m: function (r) { return numCell(r.m); }
  };

  function cellFor(key, r) {
    if (key.indexOf("e:") === 0) {
      var b = key.slice(2);
      return numCell(r.e[b], r.w.indexOf(b) >= 0);
    }
    return (CELL[key] || function () { return el("td", "muted", "\u2014"); })(r);
  }

  function rowFor(r, keys) {
    var tr = el("tr", isFailing(r) ? "bad" : (r.w.length ? "warn" : ""));
    tr.dataset.verdict = r.v;
    keys.forEach(function (k) { tr.appendChild(cellFor(k, r)); });
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
    x: function (r) { return num(r.x); },
    f: function (r) { var k = F32RANK[r.f]; return r.f === "" ? NaN : (k === undefined ? -1 : k); },
    q: function (r) { return num(r.q); },
    m: function (r) { return num(r.m); }
  };
  function keyFor(key) {
    if (key.indexOf("e:") === 0) {
      var b = key.slice(2);
      return function (r) { return num(r.e[b]); };
    }
    return KEYS[key];
  }
  // Numbers first show the largest (the worst); verdicts the worst (rank 0) first.
  function descFirst(key) { return key === "h" || key === "a" || key === "x" || key === "q" || key === "m" ||
    key.indexOf("e:") === 0; }

  function compare(key, dir) {
    var get = keyFor(key);
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
    var keys = Array.prototype.map.call(box.querySelectorAll("thead th"), function (th) { return th.dataset.k; });
    var items = data.rows.map(function (r) { return { r: r, tr: rowFor(r, keys) }; });
    var state = { key: "i", dir: 1 };
    var controls = {
      verdict: box.querySelector("[data-f=verdict]"),
      blame: box.querySelector("[data-f=blame]"),
      float32: box.querySelector("[data-f=float32]"),
      text: box.querySelector("[data-f=text]"),
      failing: box.querySelector("[data-f=failing]")
    };

    function apply() {
      var v = controls.verdict.value, b = controls.blame.value;
      var f32 = controls.float32 ? controls.float32.value : "";
      var t = controls.text.value.trim().toLowerCase(), f = controls.failing.checked;
      var count = 0;
      items.slice().sort(compare(state.key, state.dir)).forEach(function (it) {
        var r = it.r;
        var ok = (!v || r.v === v) && (!b || r.b.indexOf(b) >= 0) && (!f || isFailing(r)) &&
          (!f32 || r.f === f32) &&
          (!t || r.p.toLowerCase().indexOf(t) >= 0 || (r.l || "").toLowerCase().indexOf(t) >= 0);
        it.tr.hidden = !ok;
        if (ok) count += 1;
        tbody.appendChild(it.tr);
      });
      shown.textContent = count + " of " + items.length + " leaves shown";
      box.querySelectorAll("th[data-k]").forEach(function (th) {
        if (!th.querySelector("button")) return;
        th.setAttribute("aria-sort", th.dataset.k === state.key ? (state.dir > 0 ? "ascending" : "descending") : "none");
      });
    }

    box.querySelectorAll("th[data-k] button").forEach(function (button) {
      button.addEventListener("click", function () {
        var key = button.parentNode.dataset.k;
        if (state.key === key) state.dir = -state.dir;
        else { state.key = key; state.dir = descFirst(key) ? -1 : 1; }
        apply();
      });
    });
    ["verdict", "blame", "float32", "failing"].forEach(function (k) {
      if (controls[k]) controls[k].addEventListener("change", apply);
    });
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
