// The interactive flame graph both pages draw: the flame graph (flamegraph.html) and the
// analysis's differential one (analysis/report/diff.html). Inlined into each page by Python
// (exporter/profiles/html.py), so a page stays one self-contained file.
//
// Click a frame to zoom in (the breadcrumb zooms out), search by text or /regex/, hover
// for the frame's tooltip. The view state lives in the URL fragment
// (#zoom=a;b&search=x), so a zoomed or filtered view can be linked. Layout walks the
// tree with an explicit stack: stacks thousands of frames deep draw without recursion.
"use strict";

// A value in its unit: time and bytes scaled for reading, other units as counted.
function formatValue(v, unit) {
  const a = Math.abs(v);
  if (unit === "nanoseconds") {
    if (a >= 1e9) return (v / 1e9).toFixed(3) + " s";
    if (a >= 1e6) return (v / 1e6).toFixed(3) + " ms";
    if (a >= 1e3) return (v / 1e3).toFixed(3) + " \u00b5s";
    return v.toFixed(0) + " ns";
  }
  if (unit === "bytes") {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, x = v;
    while (Math.abs(x) >= 1024 && i < units.length - 1) { x /= 1024; i++; }
    return (i ? x.toFixed(2) : x.toFixed(0)) + " " + units[i];
  }
  return v.toLocaleString("en-US") + " " + unit;
}

// Draw the tree under `view.root` into the page's #graph, #crumbs, #status and #tip.
// A node has `n` (its name) and `c` (its children, may be absent); the page says the
// rest:
//   title               the page's heading
//   seg(node)           the node's segment in a zoom path (unique among its siblings)
//   width(node)         its width; a child's share of the view is width(child) / width(view)
//   colour(node)        its background
//   frameClass(node)    optional extra classes, each with a leading space
//   describe(el, node, viewWidth)  its data attributes and data-tooltip
//   showStatus(status, view, counts)  the status line; counts holds `search` (a term
//                       is set), `drawn`, `matchedFrames`, `matched` (the width of the
//                       outermost matching frames: a subtree counts once) and
//                       `minWidth` (narrower shares of the view are not drawn)
//   tipRoom             pixels kept free right of the tooltip's left edge
function flameGraph(view) {
  const ROOT = view.root;
  const MIN_WIDTH = 0.0005; // frames narrower than this share of the view are not drawn
  const graph = document.getElementById("graph");
  const tip = document.getElementById("tip");
  const search = document.getElementById("search");
  const status = document.getElementById("status");
  const crumbs = document.getElementById("crumbs");
  document.getElementById("title").textContent = view.title;

  function children(node) { return node.c || []; }

  // The deepest node along `path`; a segment that matches no sibling's may still name
  // one (a link written before a sibling of the same name appeared).
  function findPath(path) {
    let node = ROOT;
    const kept = [];
    for (const seg of path) {
      const next = children(node).find(function (c) { return view.seg(c) === seg; }) ||
        children(node).find(function (c) { return c.n === seg; });
      if (!next) break;
      node = next;
      kept.push(view.seg(next));
    }
    return { node: node, path: kept };
  }

  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    const zoom = params.get("zoom");
    return { zoom: zoom ? zoom.split(";") : [], search: params.get("search") || "" };
  }
  function writeHash(zoom, term) {
    const params = new URLSearchParams();
    if (zoom.length) params.set("zoom", zoom.join(";"));
    if (term) params.set("search", term);
    const text = params.toString();
    if (("#" + text) !== location.hash) location.hash = text;
  }

  function matcher(term) {
    if (!term) return null;
    if (term.length > 2 && term.startsWith("/") && term.endsWith("/")) {
      try { const re = new RegExp(term.slice(1, -1)); return function (s) { return re.test(s); }; }
      catch (e) { /* not a regex: plain text */ }
    }
    const low = term.toLowerCase();
    return function (s) { return s.toLowerCase().indexOf(low) >= 0; };
  }

  // Embedded in a page (the report's and the comparison's <iframe srcdoc>): the frame
  // takes the drawing's height, rows times depth, instead of a fixed one that left most
  // of it empty (a 5-deep graph drew 94 px in 520).
  function fitFrame() {
    let host = null;
    try { host = window.frameElement; } catch (e) { return; } // another origin: leave it
    if (!host) return;
    const bottom = graph.getBoundingClientRect().bottom + window.scrollY;
    host.style.height = Math.ceil(bottom + 24) + "px"; // the graph's margin and a border
  }

  function render() {
    const state = readHash();
    const found = findPath(state.zoom);
    const top = found.node;
    const match = matcher(state.search);
    if (search.value !== state.search) search.value = state.search;
    graph.innerHTML = "";
    crumbs.innerHTML = "";
    const all = document.createElement("a");
    all.textContent = "all";
    all.onclick = function () { writeHash([], state.search); };
    crumbs.appendChild(all);
    found.path.forEach(function (seg, i) {
      crumbs.appendChild(document.createTextNode(" \u203a "));
      const a = document.createElement("a");
      a.textContent = seg;
      a.onclick = function () { writeHash(found.path.slice(0, i + 1), state.search); };
      crumbs.appendChild(a);
    });
    const total = view.width(top) || 1;
    const rowShift = top === ROOT ? 1 : 0; // the root itself is not drawn
    let maxDepth = 0, matched = 0, matchedFrames = 0, drawn = 0;
    const frag = document.createDocumentFragment();
    // Iterative layout: (node, depth, x, its parent's path, inside a match already).
    const stack = [[top, 0, 0, null, false]];
    while (stack.length) {
      const item = stack.pop();
      const node = item[0], depth = item[1], x = item[2];
      let insideMatch = item[4];
      const w = view.width(node) / total;
      if (w < MIN_WIDTH && depth > 0) continue;
      const path = depth ? item[3].concat([view.seg(node)]) : found.path;
      const isMatch = match !== null && depth > 0 && match(node.n);
      if (isMatch) {
        matchedFrames++;
        if (!insideMatch) matched += view.width(node); // count a subtree once
        insideMatch = true;
      }
      if (depth > 0 || top !== ROOT) {
        const el = document.createElement("div");
        const extra = view.frameClass ? view.frameClass(node) : "";
        el.className = "frame" + extra + (isMatch ? " match" : (match ? " dim" : ""));
        el.style.left = (100 * x) + "%";
        el.style.width = (100 * w) + "%";
        el.style.top = ((depth - rowShift) * 18) + "px";
        el.style.background = view.colour(node);
        el.textContent = node.n;
        el.setAttribute("role", "treeitem");
        el.dataset.path = path.join(";");
        view.describe(el, node, total);
        frag.appendChild(el);
        drawn++;
        maxDepth = Math.max(maxDepth, depth);
      }
      let cx = x;
      const next = [];
      for (const c of children(node)) {
        next.push([c, depth + 1, cx, path, insideMatch]);
        cx += view.width(c) / total;
      }
      for (let i = next.length - 1; i >= 0; i--) stack.push(next[i]);
    }
    graph.appendChild(frag);
    graph.style.height = ((maxDepth + 1 - rowShift) * 18 + 4) + "px";
    fitFrame();
    view.showStatus(status, top, {
      search: match !== null, drawn: drawn, matchedFrames: matchedFrames, matched: matched,
      minWidth: MIN_WIDTH,
    });
  }

  graph.addEventListener("click", function (ev) {
    const el = ev.target.closest(".frame");
    if (!el) return;
    writeHash(el.dataset.path ? el.dataset.path.split(";") : [], search.value);
  });
  graph.addEventListener("mousemove", function (ev) {
    const el = ev.target.closest(".frame");
    if (!el) { tip.style.display = "none"; return; }
    tip.textContent = el.dataset.tooltip;
    tip.style.display = "block";
    tip.style.left = Math.max(0, Math.min(ev.clientX + 12, window.innerWidth - view.tipRoom)) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  });
  graph.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  search.addEventListener("input", function () { writeHash(readHash().zoom, search.value); });
  document.getElementById("reset").addEventListener("click", function () { writeHash([], search.value); });
  window.addEventListener("hashchange", render);
  render();
  document.body.dataset.ready = "1";
}
