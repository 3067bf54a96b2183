"use strict";
(function () {
  var errorsEl = document.getElementById("errors");
  function fail(msg) {
    errorsEl.textContent += (errorsEl.textContent ? "\n" : "") + msg;
  }
  window.addEventListener("error", function (e) {
    fail("script error: " + (e && e.message ? e.message : e));
    if (e && e.preventDefault) e.preventDefault();
  });

  var D = JSON.parse(document.getElementById("data").textContent);
  // The SVG namespace (a name, not a network address; spelt in two parts so that the page holds
  // no URL at all).
  var NS = "http:" + "//www.w3.org/2000/svg";
  var DIMS = ["tp", "cp", "pp", "dp", "ep"];
  var state = { step: -1, sel: -1, metric: (D.root_index && D.root_index.length) ? "root" : "seed" };
  function isRoot() { return state.metric === "root"; }
  function thr() { return isRoot() ? D.root_threshold : D.threshold; }
  function jobVals() { return isRoot() ? D.root_index : D.index; }
  function stepVals(k) { return isRoot() ? D.step_root_index[k] : D.step_index[k]; }
  var posOf = {};
  D.ranks.forEach(function (r, i) { posOf[r] = i; });
  var detailOf = {};
  D.details.forEach(function (d) { detailOf[d.pos] = d; });
  var opsOf = {};
  D.ops.forEach(function (o) { opsOf[o.rank] = o; });

  // ---------- helpers ----------
  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "cls") e.className = attrs[k];
      else if (k === "onclick") e.addEventListener("click", attrs[k]);
      else e.setAttribute(k, attrs[k]);
    }
    (kids || []).forEach(function (c) {
      if (c === null || c === undefined) return;
      e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function ms(us) {
    if (us >= 1e6) return (us / 1e6).toFixed(2) + " s";
    return (us / 1e3).toFixed(us >= 1e5 ? 0 : 1) + " ms";
  }
  function fmtIx(t) { return t < 0 ? "–" : (t / 10).toFixed(1); }
  function bytes(b) {
    if (b >= 1 << 30) return (b / (1 << 30)).toFixed(1) + " GiB";
    if (b >= 1 << 20) return (b / (1 << 20)).toFixed(1) + " MiB";
    if (b >= 1 << 10) return (b / (1 << 10)).toFixed(1) + " KiB";
    return b + " B";
  }
  function rankLink(r) {
    return el("a", { cls: "rank", text: String(r), onclick: function () { select(posOf[r]); } });
  }
  function badge(cls, text) { return el("span", { cls: "badge " + cls, text: text || cls }); }
  function table(head, rows, numeric) {
    var t = el("table");
    var tr = el("tr");
    head.forEach(function (h, i) { tr.appendChild(el("th", { cls: numeric && numeric[i] ? "num" : "", text: h })); });
    t.appendChild(tr);
    rows.forEach(function (r) {
      var row = el("tr");
      r.forEach(function (c, i) {
        var td = el("td", { cls: numeric && numeric[i] ? "num" : "" });
        if (c !== null && typeof c === "object") td.appendChild(c); else td.textContent = String(c);
        row.appendChild(td);
      });
      t.appendChild(row);
    });
    return t;
  }
  function kv(rows) {
    var t = el("table", { cls: "kv" });
    rows.forEach(function (r) {
      var td = el("td");
      if (typeof r[1] === "object") td.appendChild(r[1]); else td.textContent = String(r[1]);
      t.appendChild(el("tr", null, [el("td", { text: r[0] }), td]));
    });
    return t;
  }
  function frag(items) {
    var f = el("span");
    items.forEach(function (x, i) {
      if (i) f.appendChild(document.createTextNode(", "));
      f.appendChild(typeof x === "object" ? x : document.createTextNode(String(x)));
    });
    return f;
  }
  function copyButton(text) {
    var b = el("button", { text: "copy", type: "button" });
    b.addEventListener("click", function () {
      var done = function () { b.textContent = "copied"; };
      var fallback = function () {
        var ta = el("textarea");
        ta.value = text;
        document.body.appendChild(ta);
        ta.select();
        try { document.execCommand("copy"); done(); } catch (e) { b.textContent = "select and copy"; }
        document.body.removeChild(ta);
      };
      try {
        if (navigator.clipboard && navigator.clipboard.writeText) {
          navigator.clipboard.writeText(text).then(done, fallback);
        } else fallback();
      } catch (e) { fallback(); }
    });
    return b;
  }
  // Colour of an index (tenths): light grey .. yellow .. orange (threshold) .. dark red.
  var vmax = 1;
  function rescale() {
    vmax = Math.max(thr() * 2, 1);
    jobVals().forEach(function (t) { if (t / 10 > vmax) vmax = t / 10; });
  }
  rescale();
  var STOPS = [[0, [236, 241, 247]], [0.25, [254, 240, 138]], [0.5, [245, 158, 11]], [1, [127, 29, 29]]];
  function colour(t) {
    if (t < 0) return "#ffffff";
    var x = Math.min(1, (t / 10) / vmax);
    for (var i = 1; i < STOPS.length; i++) {
      if (x <= STOPS[i][0]) {
        var a = STOPS[i - 1], b = STOPS[i], f = (x - a[0]) / (b[0] - a[0]);
        var c = a[1].map(function (v, k) { return Math.round(v + (b[1][k] - v) * f); });
        return "rgb(" + c.join(",") + ")";
      }
    }
    return "rgb(127,29,29)";
  }
  function values() {
    return state.step < 0 ? jobVals() : stepVals(state.step);
  }

  // ---------- header and summary ----------
  function header() {
    document.getElementById("job").textContent = D.job;
    document.getElementById("meta").textContent = "input " + D.source + " · " + D.generator +
      (D.notes.length ? " · " + D.notes.join(" · ") : "");
  }
  function summary() {
    var s = D.summary, g = D.grid;
    var steps = D.step_stats;
    var stragglers;
    if (s.top.length) {
      stragglers = el("div", null, s.top.map(function (t) {
        return el("div", null, ["rank ", rankLink(t.rank), " on " + t.host + ": root index " + t.root_index.toFixed(1) +
          ", fixing it would save " + t.saves_pct.toFixed(1) + " % of the step (seed index " + t.index.toFixed(1) + ") ",
          badge(t.class), " " + (t.chain || t.reason)]);
      }));
    } else {
      stragglers = el("div", null, ["no straggler (root index above " + D.root_threshold.toFixed(1) +
        " with an own excess above " + D.root_min_delay.toFixed(1) + " % of the step)" +
        (s.highest ? "; highest: rank " : ""), s.highest ? rankLink(s.highest.rank) : null,
        s.highest ? " (root index " + s.highest.root_index.toFixed(1) + ", seed index " + s.highest.index.toFixed(1) + ")" : null]);
    }
    var body = document.querySelector("#summary .body");
    body.appendChild(kv([
      ["job", D.job],
      ["world size", D.world + " ranks on " + D.hosts.length + " host(s)"],
      ["grid", "tp=" + g.tp + " cp=" + g.cp + " pp=" + g.pp + " dp=" + g.dp + " ep=" + g.ep +
        " (confidence " + D.grid_confidence.toFixed(2) + (D.coords_guessed ? "; some positions derived from rank numbers" : "") + ")"],
      ["template", D.template || "none matched"],
      ["steps seen", steps.length ? steps.length + " (" + steps[0].step + ".." + steps[steps.length - 1].step + ", " +
        (D.calibrated ? "calibrated" : "raw") + " numbers)" : "none"],
      ["step time", "median " + ms(s.median_step_us) + ", p95 " + ms(s.p95_step_us)],
      ["top straggler(s)", stragglers],
      ["hang verdicts", D.hang ? String(s.hang_verdicts) : "no hang analysis"],
    ]));
  }

  // ---------- step-duration chart ----------
  function stepChart() {
    var host = document.getElementById("stepchart");
    var st = D.step_stats;
    if (!st.length) { host.appendChild(el("p", { cls: "note", text: "no step summaries" })); return; }
    var W = 1100, H = 240, L = 60, R = 10, T = 10, B = 30;
    var s = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H });
    var ymax = 0;
    st.forEach(function (x) { if (x.max_us > ymax) ymax = x.max_us; });
    ymax = ymax * 1.05 || 1;
    var n = st.length;
    var xw = (W - L - R) / Math.max(1, n);
    function X(i) { return L + xw * (i + 0.5); }
    function Y(v) { return T + (H - T - B) * (1 - v / ymax); }
    var raw = ymax / 4, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var tick = [1, 2, 2.5, 5, 10].map(function (f) { return f * mag; }).filter(function (t) { return t >= raw; })[0];
    for (var k = 0; k * tick <= ymax; k++) {
      var v = k * tick;
      s.appendChild(svg("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: "#e5e7eb" }));
      var tx = svg("text", { x: L - 4, y: Y(v) + 4, "text-anchor": "end" });
      tx.textContent = ms(v);
      s.appendChild(tx);
    }
    var band = st.map(function (x, i) { return X(i) + "," + Y(x.max_us); })
      .concat(st.slice().reverse().map(function (x, j) { return X(n - 1 - j) + "," + Y(x.min_us); }));
    s.appendChild(svg("polygon", { points: band.join(" "), fill: "#bfdbfe", stroke: "none" }));
    s.appendChild(svg("polyline", { points: st.map(function (x, i) { return X(i) + "," + Y(x.max_us); }).join(" "), fill: "none", stroke: "#b91c1c", "stroke-width": 1 }));
    s.appendChild(svg("polyline", { points: st.map(function (x, i) { return X(i) + "," + Y(x.min_us); }).join(" "), fill: "none", stroke: "#1d4ed8", "stroke-width": 1 }));
    s.appendChild(svg("polyline", { points: st.map(function (x, i) { return X(i) + "," + Y(x.mean_us); }).join(" "), fill: "none", stroke: "#111827", "stroke-width": 1.5 }));
    var every = Math.ceil(n / 20);
    st.forEach(function (x, i) {
      var hit = svg("rect", { x: X(i) - xw / 2, y: T, width: xw, height: H - T - B, fill: "transparent", cursor: "pointer" });
      var t = svg("title", {});
      t.textContent = "step " + x.step + ": min " + ms(x.min_us) + ", mean " + ms(x.mean_us) + ", max " + ms(x.max_us) +
        " over " + x.ranks + " ranks" + (x.top_rank >= 0 ? "; top index: rank " + x.top_rank : "");
      hit.appendChild(t);
      hit.addEventListener("click", function () { setStep(i); });
      s.appendChild(hit);
      if (i % every === 0) {
        var lb = svg("text", { x: X(i), y: H - B + 14, "text-anchor": "middle" });
        lb.textContent = String(x.step);
        s.appendChild(lb);
      }
    });
    host.appendChild(s);
    host.appendChild(el("div", { cls: "note", text: "per step over ranks: max (red), mean (black), min (blue); click a step to show it on the heatmap" }));
  }

  // ---------- heatmap ----------
  var geo = null;
  function panelsOf() {
    // Panels: (pp, ep); tiles in a panel: dp values; cells in a tile: cp rows x tp columns.
    var map = {}, keys = [];
    D.coords.forEach(function (c, i) {
      var k = c[2] + ":" + c[4];
      if (!map[k]) { map[k] = { pp: c[2], ep: c[4], dps: {}, list: [] }; keys.push(k); }
      map[k].dps[c[3]] = true;
      map[k].list.push(i);
    });
    keys.sort(function (a, b) {
      var x = map[a], y = map[b];
      return x.ep - y.ep || x.pp - y.pp;
    });
    var tp = 1, cp = 1;
    D.coords.forEach(function (c) { if (c[0] + 1 > tp) tp = c[0] + 1; if (c[1] + 1 > cp) cp = c[1] + 1; });
    return { tp: tp, cp: cp, panels: keys.map(function (k) {
      var p = map[k];
      var dps = Object.keys(p.dps).map(Number).sort(function (a, b) { return a - b; });
      var ix = {};
      dps.forEach(function (d, i) { ix[d] = i; });
      p.tileOf = ix;
      p.ntiles = dps.length;
      return p;
    }) };
  }
  function layout(P, W, H) {
    // Panels per line (pl) and DP tiles per panel line (tl): the largest cells that fit W x H;
    // among equal cells the most compact page.
    var np = P.panels.length, nt = 1;
    P.panels.forEach(function (p) { if (p.ntiles > nt) nt = p.ntiles; });
    var PG = 18, TITLE = 16, MINPW = 170, best = null;
    for (var pl = 1; pl <= np; pl++) {
      var lines = Math.ceil(np / pl);
      var pw = (W - (pl - 1) * PG) / pl;
      for (var tl = 1; tl <= nt; tl++) {
        if (tl > 1 && Math.ceil(nt / tl) === Math.ceil(nt / (tl - 1))) continue;
        var trows = Math.ceil(nt / tl);
        var g = 3;
        var cw = (pw - (tl - 1) * g) / (tl * P.tp);
        var ph = (H - lines * (TITLE + PG)) / lines;
        var ch = (ph - (trows - 1) * g) / (trows * P.cp);
        var cell = Math.max(2, Math.floor(Math.min(cw, ch, 36)));
        var tg = cell >= 5 ? 3 : 1;
        var width = pl * Math.max(MINPW, tl * P.tp * cell + (tl - 1) * tg) + (pl - 1) * PG;
        if (width > W && pl > 1) continue;
        var height = lines * (trows * P.cp * cell + (trows - 1) * tg + TITLE + PG);
        var c = { pl: pl, tl: tl, cell: cell, trows: trows, lines: lines, area: width * height };
        if (!best || c.cell > best.cell || (c.cell === best.cell && c.area < best.area)) best = c;
      }
    }
    best.gap = best.cell >= 5 ? 1 : 0;
    best.tgap = best.cell >= 5 ? 3 : 1;
    best.PG = PG; best.TITLE = TITLE;
    best.pw = Math.max(MINPW, best.tl * P.tp * best.cell + (best.tl - 1) * best.tgap);
    best.ph = best.trows * P.cp * best.cell + (best.trows - 1) * best.tgap;
    return best;
  }
  function drawHeatmap() {
    var canvas = document.getElementById("hm");
    var wrap = document.getElementById("hmwrap");
    var P = panelsOf();
    var W = Math.max(300, Math.min(1200, wrap.clientWidth - 4 || 900));
    var Lg = layout(P, W, 720);
    var lines = Math.ceil(P.panels.length / Lg.pl);
    var cw = Lg.pl * Lg.pw + (Lg.pl - 1) * Lg.PG;
    var chh = lines * (Lg.ph + Lg.TITLE + Lg.PG);
    canvas.width = Math.ceil(cw);
    canvas.height = Math.ceil(chh);
    var ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    var pick = new Int32Array(canvas.width * canvas.height).fill(-1);
    var rect = new Array(D.ranks.length);
    var vals = values();
    ctx.font = "12px system-ui, sans-serif";
    P.panels.forEach(function (p, pi) {
      var px = (pi % Lg.pl) * (Lg.pw + Lg.PG);
      var py = Math.floor(pi / Lg.pl) * (Lg.ph + Lg.TITLE + Lg.PG);
      ctx.fillStyle = "#61707f";
      ctx.fillText("PP stage " + p.pp + (D.grid.ep > 1 ? " · EP " + p.ep : "") + " (" + p.ntiles + " DP replica" + (p.ntiles > 1 ? "s" : "") + ")", px, py + 12);
      var oy = py + Lg.TITLE;
      p.list.forEach(function (i) {
        var c = D.coords[i];
        var t = p.tileOf[c[3]];
        var tx = px + (t % Lg.tl) * (P.tp * Lg.cell + Lg.tgap);
        var ty = oy + Math.floor(t / Lg.tl) * (P.cp * Lg.cell + Lg.tgap);
        var x = tx + c[0] * Lg.cell, y = ty + c[1] * Lg.cell, w = Lg.cell - Lg.gap, h = Lg.cell - Lg.gap;
        ctx.fillStyle = colour(vals[i]);
        ctx.fillRect(x, y, w, h);
        if (vals[i] < 0 && w >= 4) { ctx.strokeStyle = "#c0c6cc"; ctx.strokeRect(x + 0.5, y + 0.5, w - 1, h - 1); }
        rect[i] = [x, y, w, h];
        for (var yy = y; yy < y + Lg.cell && yy < canvas.height; yy++) {
          pick.fill(i, yy * canvas.width + x, Math.min(yy * canvas.width + x + Lg.cell, (yy + 1) * canvas.width));
        }
      });
    });
    if (state.sel >= 0 && rect[state.sel]) {
      var r = rect[state.sel];
      ctx.strokeStyle = "#111827";
      ctx.lineWidth = 2;
      ctx.strokeRect(r[0] - 1.5, r[1] - 1.5, r[2] + 3, r[3] + 3);
      ctx.lineWidth = 1;
    }
    geo = { pick: pick, w: canvas.width, h: canvas.height, rect: rect, cell: Lg.cell };
    document.getElementById("hmnote").textContent = D.ranks.length + " ranks; one cell per rank (" + Lg.cell +
      " px), DP replicas as tiles of cp × tp cells, one panel per PP stage" + (D.grid.ep > 1 ? " and EP index" : "") +
      ". Colour: straggler index (" + (state.step < 0 ? "mean over complete steps" : "step " + D.step_stats[state.step].step) +
      "); white: no value.";
    aggregates(P, vals);
  }
  function aggregates(P, vals) {
    // Per PP stage and the worst DP replicas: what to look at first when cells are small.
    var host = document.getElementById("agg");
    host.textContent = "";
    var stages = {}, reps = {};
    D.coords.forEach(function (c, i) {
      var v = vals[i];
      if (v < 0) return;
      var s = stages[c[2]] || (stages[c[2]] = { n: 0, sum: 0, max: -1, arg: -1 });
      s.n++; s.sum += v; if (v > s.max) { s.max = v; s.arg = i; }
      var rk = c[2] + "/" + c[3];
      var r = reps[rk] || (reps[rk] = { pp: c[2], dp: c[3], n: 0, sum: 0, max: -1, arg: -1 });
      r.n++; r.sum += v; if (v > r.max) { r.max = v; r.arg = i; }
    });
    var srows = Object.keys(stages).map(Number).sort(function (a, b) { return a - b; }).map(function (k) {
      var s = stages[k];
      return [k, s.n, fmtIx(Math.round(s.sum / s.n)), fmtIx(s.max), rankLink(D.ranks[s.arg])];
    });
    var rlist = Object.keys(reps).map(function (k) { return reps[k]; })
      .sort(function (a, b) { return b.max - a.max || a.pp - b.pp || a.dp - b.dp; }).slice(0, 8);
    var rrows = rlist.map(function (r) {
      return [r.pp, r.dp, fmtIx(Math.round(r.sum / r.n)), fmtIx(r.max), rankLink(D.ranks[r.arg])];
    });
    host.appendChild(el("div", { cls: "cols" }, [
      el("div", null, [el("h3", { text: "Per PP stage" }), table(["stage", "ranks", "mean", "max", "worst rank"], srows, [1, 1, 1, 1, 0])]),
      el("div", null, [el("h3", { text: "Worst DP replicas" }), table(["pp", "dp", "mean", "max", "worst rank"], rrows, [1, 1, 1, 1, 0])]),
    ]));
  }
  function legend() {
    var c = document.getElementById("legendbar");
    var ctx = c.getContext("2d");
    ctx.clearRect(0, 0, c.width, c.height);
    for (var x = 0; x < c.width; x++) {
      ctx.fillStyle = colour(Math.round((x / (c.width - 1)) * vmax * 10));
      ctx.fillRect(x, 0, 1, c.height);
    }
    var tx = Math.round(thr() / vmax * (c.width - 1));
    ctx.fillStyle = "#111827";
    ctx.fillRect(tx, 0, 1, c.height);
    document.getElementById("legendmax").textContent = vmax.toFixed(1) + " (" + (isRoot() ? "root" : "seed") + " threshold " + thr().toFixed(1) + " marked)";
  }
  function setupHeatmap() {
    var sel = document.getElementById("stepsel");
    sel.appendChild(el("option", { value: "-1", text: "all steps (mean over complete steps)" }));
    D.step_stats.forEach(function (s, i) {
      sel.appendChild(el("option", { value: String(i), text: "step " + s.step }));
    });
    sel.addEventListener("change", function () { state.step = Number(sel.value); drawHeatmap(); });
    var msel = document.getElementById("metricsel");
    msel.value = state.metric;
    msel.addEventListener("change", function () {
      state.metric = msel.value;
      rescale();
      legend();
      drawHeatmap();
      if (state.sel >= 0) drill(state.sel);
    });
    var find = document.getElementById("rankfind");
    find.addEventListener("change", function () {
      var p = posOf[Number(find.value)];
      if (p !== undefined) select(p);
    });
    var canvas = document.getElementById("hm");
    var tip = document.getElementById("tip");
    function at(ev) {
      if (!geo) return -1;
      var b = canvas.getBoundingClientRect();
      var x = Math.floor((ev.clientX - b.left) * canvas.width / b.width);
      var y = Math.floor((ev.clientY - b.top) * canvas.height / b.height);
      if (x < 0 || y < 0 || x >= geo.w || y >= geo.h) return -1;
      return geo.pick[y * geo.w + x];
    }
    canvas.addEventListener("mousemove", function (ev) {
      var i = at(ev);
      if (i < 0) { tip.style.display = "none"; return; }
      var c = D.coords[i];
      var d = detailOf[i];
      tip.textContent = "rank " + D.ranks[i] + " · " + D.hosts[D.rank_host[i]] + " · tp" + c[0] + " cp" + c[1] + " pp" + c[2] + " dp" + c[3] +
        (D.grid.ep > 1 ? " ep" + c[4] : "") + " · " + (isRoot() ? "root index " : "index ") + fmtIx(values()[i]) + (d && d.class !== "none" ? " · " + d.class : "");
      var wb = document.getElementById("hmwrap").getBoundingClientRect();
      tip.style.left = (ev.clientX - wb.left + 14 + document.getElementById("hmwrap").scrollLeft) + "px";
      tip.style.top = (ev.clientY - wb.top + 14 + document.getElementById("hmwrap").scrollTop) + "px";
      tip.style.display = "block";
    });
    canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    canvas.addEventListener("click", function (ev) { var i = at(ev); if (i >= 0) select(i); });
    legend();
  }
  function setStep(i) {
    state.step = i;
    document.getElementById("stepsel").value = String(i);
    drawHeatmap();
  }

  // ---------- drill-down ----------
  var commsOfRank = null;
  function commsOf(rank) {
    if (!commsOfRank) {
      commsOfRank = {};
      D.comms.forEach(function (c, ci) {
        c.ranks.forEach(function (r, k) {
          (commsOfRank[r] || (commsOfRank[r] = [])).push([ci, k]);
        });
      });
    }
    return commsOfRank[rank] || [];
  }
  function select(i) {
    if (i === undefined || i < 0) return;
    state.sel = i;
    drawHeatmap();
    drill(i);
  }
  function stepBars(i) {
    var W = 390, H = 90, B = 16, n = D.step_stats.length;
    var s = svg("svg", { width: W, height: H });
    if (!n) return s;
    var bw = W / n, top = vmax;
    var y0 = H - B;
    var ty = y0 - (y0 - 4) * Math.min(1, thr() / top);
    D.step_stats.forEach(function (st, k) {
      var v = stepVals(k)[i];
      var h = v < 0 ? 0 : (y0 - 4) * Math.min(1, v / 10 / top);
      var r = svg("rect", { x: k * bw + 0.5, y: y0 - h, width: Math.max(1, bw - 1), height: Math.max(h, v < 0 ? 0 : 1), fill: colour(v < 0 ? 0 : v) });
      var t = svg("title", {});
      t.textContent = "step " + st.step + ": index " + fmtIx(v);
      r.appendChild(t);
      s.appendChild(r);
    });
    s.appendChild(svg("line", { x1: 0, x2: W, y1: ty, y2: ty, stroke: "#111827", "stroke-dasharray": "3,3" }));
    var a = svg("text", { x: 0, y: H - 3 }); a.textContent = "step " + D.step_stats[0].step; s.appendChild(a);
    var b = svg("text", { x: W, y: H - 3, "text-anchor": "end" }); b.textContent = "step " + D.step_stats[n - 1].step; s.appendChild(b);
    return s;
  }
  function peers(rows, title) {
    if (!rows.length) return el("p", { cls: "note", text: title + ": none" });
    return el("div", null, [el("h3", { text: title }), table(["rank", "net wait", "steps"],
      rows.map(function (r) { return [posOf[r[0]] !== undefined ? rankLink(r[0]) : String(r[0]), ms(r[1]), r[2]]; }), [0, 1, 1])]);
  }
  function opsBlock(rank) {
    var o = opsOf[rank];
    var box = el("div");
    box.appendChild(el("h3", { text: "Ops" }));
    if (!o || !o.steps.length) {
      box.appendChild(el("p", { cls: "note", text: D.ops_note }));
      return box;
    }
    var sel = el("select");
    o.steps.forEach(function (s, k) { sel.appendChild(el("option", { value: String(k), text: "step " + s.step + " (" + s.ops.length + " ops)" })); });
    var holder = el("div");
    function show() {
      var s = o.steps[Number(sel.value)];
      holder.textContent = "";
      var rows = s.ops.map(function (r) {
        var c = r[1] >= 0 ? D.comms[r[1]] : null;
        return [D.funcs[r[0]] || "?", c ? c.role + (c.name ? " " + c.name : "") : "?", r[2], ms(r[3]), ms(r[4]), bytes(r[5])];
      });
      holder.appendChild(table(["func", "comm", "seq", "start", "dur", "bytes"], rows, [0, 0, 1, 1, 1, 1]));
      if (s.dropped) holder.appendChild(el("p", { cls: "note", text: s.dropped + " more ops of this step left out" }));
    }
    sel.addEventListener("change", show);
    box.appendChild(el("div", { cls: "note" }, ["step: ", sel, " — start: from the job's first op of the step"]));
    box.appendChild(holder);
    show();
    return box;
  }
  function drill(i) {
    var box = document.getElementById("drill");
    box.textContent = "";
    var rank = D.ranks[i], c = D.coords[i], d = detailOf[i];
    box.appendChild(el("h3", { text: "Rank " + rank }));
    var rows = [
      ["host", D.hosts[D.rank_host[i]]],
      ["grid", "tp " + c[0] + ", cp " + c[1] + ", pp " + c[2] + ", dp " + c[3] + (D.grid.ep > 1 ? ", ep " + c[4] : "")],
      ["root index", d ? d.root_index.toFixed(1) + " (" + d.root_steps_over + " step(s) over " + D.root_threshold.toFixed(1) +
        "; own excess " + d.root_delay.toFixed(1) + " % of the step; fixing it saves " + d.saves_pct.toFixed(1) + " %)" : fmtIx(D.root_index[i])],
      ["seed index", d ? d.index.toFixed(1) + " (max " + d.max_index.toFixed(1) + ", " + d.steps_over + " step(s) over " + D.threshold.toFixed(1) + ", " + d.complete_steps + " complete)" : fmtIx(D.index[i])],
    ];
    if (d && d.chain) rows.push(["chain", d.chain]);
    if (d) rows.push(["class", el("span", null, [badge(d.class), " " + d.reason])]);
    if (d && d.host_cpu) rows.push(["main thread", d.host_cpu]);
    if (d && d.host_tcp) rows.push(["TCP", d.host_tcp]);
    if (d && d.host_links) rows.push(["Ports", d.host_links]);
    if (d && d.host_gpu) rows.push(["GPU", d.host_gpu]);
    box.appendChild(kv(rows));
    box.appendChild(el("h3", { text: "Index per step" }));
    box.appendChild(stepBars(i));
    var cs = commsOf(rank);
    box.appendChild(el("h3", { text: "Communicators" }));
    box.appendChild(cs.length ? table(["role", "rank in comm", "name", "hash"], cs.map(function (x) {
      var cm = D.comms[x[0]];
      return [cm.role.toUpperCase(), x[1] + " / " + cm.ranks.length, cm.name || "–", cm.hash];
    })) : el("p", { cls: "note", text: "no communicator membership seen" }));
    box.appendChild(peers(d ? d.causes : [], "Top causes (waited for)"));
    box.appendChild(peers(d ? d.victims : [], "Top victims (made wait)"));
    box.appendChild(opsBlock(rank));
  }

  // ---------- hang ----------
  function hang() {
    var host = document.querySelector("#hang .body");
    if (!D.hang) { host.appendChild(el("p", { cls: "note", text: "no hang analysis for this input" })); return; }
    if (!D.hang.verdicts.length) {
      host.appendChild(el("p", { text: "No hang verdict: no rank waits on another beyond the threshold." +
        (D.hang.resolved ? " " + D.hang.resolved + " stall(s) resolved on their own." : "") }));
      return;
    }
    D.hang.verdicts.forEach(function (v) {
      var card = el("div", { cls: "verdict" });
      card.appendChild(el("div", null, [badge(v.kind, v.kind), " source rank(s) ", frag(v.source_ranks.map(function (r) {
        return posOf[r] !== undefined ? rankLink(r) : String(r);
      }))]));
      card.appendChild(kv([
        ["first stuck op", v.func + " seq " + v.seq + " on " + (v.comm.role || "?") + " comm " + v.comm.hash + (v.comm.name ? " (" + v.comm.name + ")" : "")],
        ["entered / absent", v.entered + " / " + v.absent + (v.absent_ranks.length ? " (absent: " + v.absent_ranks.join(",") + (v.absent > v.absent_ranks.length ? ", …" : "") + ")" : "")],
      ]));
      if (v.chain.length) {
        card.appendChild(el("h3", { text: "Wait-for chain" }));
        card.appendChild(table(["rank", "waits in", "for"], v.chain.map(function (l) {
          return [posOf[l.rank] !== undefined ? rankLink(l.rank) : String(l.rank), l.func + " seq " + l.seq + " (" + l.comm + ")", l.waits_for.join(", ")];
        })));
        if (v.chain_dropped) card.appendChild(el("p", { cls: "note", text: v.chain_dropped + " more links left out" }));
      }
      v.stacks.forEach(function (s) {
        card.appendChild(el("h3", { text: "Stacks of rank " + s.rank + (s.source ? " (source)" : " (waiter)") +
          (s.proc_state ? " · " + s.proc_state.status + (s.proc_state.detail ? " " + s.proc_state.detail : "") : "") }));
        if (s.stacks.error) card.appendChild(el("p", { cls: "note", text: s.stacks.error }));
        s.stacks.threads.forEach(function (t) {
          var b = el("div", { cls: "stack" });
          b.appendChild(el("div", null, ["thread " + (t.name || t.thread_id) + (t.active ? " (active)" : " (idle)") + " ",
            t.owns_gil ? badge("gil", "holds the GIL") : null]));
          t.frames.forEach(function (f) {
            b.appendChild(el("div", { cls: f.native ? "native" : "", text: "  " + f.name + (f.file ? " (" + f.file + (f.line ? ":" + f.line : "") + ")" : "") + (f.native ? " [native]" : "") }));
          });
          card.appendChild(b);
        });
      });
      host.appendChild(card);
    });
  }

  // ---------- EP ----------
  function ramp(x) {
    x = Math.max(0, Math.min(1, x));
    for (var i = 1; i < STOPS.length; i++) {
      if (x <= STOPS[i][0]) {
        var a = STOPS[i - 1], b = STOPS[i], f = (x - a[0]) / (b[0] - a[0]);
        var c = a[1].map(function (v, k) { return Math.round(v + (b[1][k] - v) * f); });
        return "rgb(" + c.join(",") + ")";
      }
    }
    return "rgb(" + STOPS[STOPS.length - 1][1].join(",") + ")";
  }
  // One EP group's wait matrix: rows the waiting rank, columns the rank waited on; colour the
  // cell over the window's mean cell; flagged columns, rows and cells outlined.
  function waitMatrix(host, w) {
    host.appendChild(el("h3", { text: w.title }));
    var n = w.ratio.length, cell = Math.max(3, Math.min(24, Math.floor(600 / Math.max(1, n))));
    var c = el("canvas", { width: String(n * cell), height: String(n * cell), cls: "epwait", "data-phase": w.phase });
    var ctx = c.getContext("2d"), mx = 20;
    w.ratio.forEach(function (r) { r.forEach(function (v) { if (v > mx) mx = v; }); });
    w.ratio.forEach(function (r, y) {
      r.forEach(function (v, x) {
        ctx.fillStyle = ramp(v / mx);
        ctx.fillRect(x * cell, y * cell, cell - (cell > 4 ? 1 : 0), cell - (cell > 4 ? 1 : 0));
      });
    });
    ctx.lineWidth = 2;
    ctx.strokeStyle = "#1d4ed8";
    w.senders.forEach(function (j) { ctx.strokeRect(j * cell + 1, 1, cell - 2, n * cell - 2); });
    w.receivers.forEach(function (i) { ctx.strokeRect(1, i * cell + 1, n * cell - 2, cell - 2); });
    w.paths.forEach(function (p) { ctx.strokeRect(p[1] * cell + 1, p[0] * cell + 1, cell - 2, cell - 2); });
    c.addEventListener("mousemove", function (ev) {
      var r = c.getBoundingClientRect(), x = Math.floor((ev.clientX - r.left) / cell), y = Math.floor((ev.clientY - r.top) / cell);
      if (x >= 0 && y >= 0 && x < n && y < n) c.title = "rank " + y + " waited on rank " + x + ": " + (w.ratio[y][x] / 10).toFixed(1) + "x the mean cell";
    });
    host.appendChild(c);
    host.appendChild(el("p", { cls: "note", text: "rows: the waiting rank (EP-group rank), columns: the rank waited on; colour: the cell over the window's mean cell (0 to " + (mx / 10).toFixed(1) + "x); outlined in blue: slow senders (columns), slow receivers (rows), slow paths (cells)" }));
  }
  function ep() {
    var sec = document.getElementById("ep");
    if (!sec || !D.ep) return;
    var host = sec.querySelector(".body");
    if (D.ep.waits) {
      host.appendChild(el("p", { text: D.ep.windows + " EP windows analysed with DeepXTrace's detector, " + D.ep.findings + " with a finding or missing a rank" }));
      (D.ep.lines || []).forEach(function (l) { host.appendChild(el("div", { cls: "epline", text: l })); });
      D.ep.waits.forEach(function (w) { waitMatrix(host, w); });
    }
    D.ep.matrices.forEach(function (m) {
      host.appendChild(el("h3", { text: m.title }));
      var n = m.ranks.length, cell = Math.max(3, Math.min(24, Math.floor(600 / Math.max(1, n))));
      var c = el("canvas", { width: String(n * cell), height: String(n * cell) });
      var ctx = c.getContext("2d"), mx = 1;
      m.bytes.forEach(function (r) { r.forEach(function (b) { if (b > mx) mx = b; }); });
      m.bytes.forEach(function (r, y) {
        r.forEach(function (b, x) {
          ctx.fillStyle = colour(Math.round(b / mx * vmax * 10));
          ctx.fillRect(x * cell, y * cell, cell - (cell > 4 ? 1 : 0), cell - (cell > 4 ? 1 : 0));
        });
      });
      host.appendChild(c);
      host.appendChild(el("p", { cls: "note", text: "rows: senders, columns: receivers (ranks " + m.ranks.slice(0, 8).join(",") + (n > 8 ? ",…" : "") + "); max " + bytes(mx) }));
    });
  }

  // ---------- traces ----------
  function traces() {
    var host = document.querySelector("#traces .body");
    if (!D.traces.length) { host.appendChild(el("p", { cls: "note", text: "no step range to suggest" })); return; }
    host.appendChild(el("p", { cls: "note", text: "This page cannot run commands: copy one and run it where the input directory is, then open the file in ui.perfetto.dev (the trace stays on your machine)." }));
    D.traces.forEach(function (t) {
      host.appendChild(el("div", { style: "margin:8px 0" }, [el("div", { text: t.label }), el("pre", { cls: "cmd", text: t.command }), " ", copyButton(t.command)]));
    });
  }

  try {
    header();
    summary();
    stepChart();
    setupHeatmap();
    drawHeatmap();
    var first = D.summary.top.length ? D.summary.top[0].rank : (D.summary.highest ? D.summary.highest.rank : D.ranks[0]);
    if (first !== undefined && posOf[first] !== undefined) select(posOf[first]);
    hang();
    ep();
    traces();
    document.getElementById("opsnote").textContent = D.ops_note;
  } catch (e) {
    fail("could not render the report: " + (e && e.stack ? e.stack : e));
  }
  document.body.dataset.ready = "1";
})();
