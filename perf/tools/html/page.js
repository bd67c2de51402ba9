// fuseg segmentation page. The data is the JSON in #fuseg-data (perf/tools/html/data.py); every name
// from the graph reaches the page through textContent or an attribute, never as markup.
(function () {
  'use strict';
  var T0 = performance.now();
  var SVGNS = 'http://www.w3.org/2000/svg';
  var SEG_W = 210, SEG_H = 48, NODE_W = 176, NODE_H = 24, GAP_X = 30, GAP_Y = 44, PAD = 10, HEAD = 24,
    NODES_PER_ROW = 6, MARGIN = 20, LIST_MAX = 200;
  var KINDS = ['pointwise', 'reduction', 'normalization', 'matmul', 'opaque', 'metadata'];

  function reportError(msg) {
    var box = document.getElementById('errors');
    if (box) { box.hidden = false; var li = document.createElement('li'); li.textContent = msg; box.appendChild(li); }
    document.body.setAttribute('data-errors', String((+document.body.getAttribute('data-errors') || 0) + 1));
  }
  window.addEventListener('error', function (e) { reportError('script error: ' + e.message + ' (line ' + e.lineno + ')'); });

  var DATA = JSON.parse(document.getElementById('fuseg-data').textContent);
  var state = { graph: 0, mode: 0, expanded: new Set(), selected: null, query: '', reason: -1 };
  var current = null;  // the drawn graph: {G, M, geo, svg}

  // ---- small helpers -------------------------------------------------------------------------
  function h(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function s(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); return e; }
  function bytes(n) {
    if (n >= 1e9) return (n / 1e9).toFixed(2) + ' GB';
    if (n >= 1e6) return (n / 1e6).toFixed(2) + ' MB';
    if (n >= 1e3) return (n / 1e3).toFixed(1) + ' kB';
    return n + ' B';
  }
  function shortOp(op) { return op.replace(/^aten\./, '').replace(/\.default$/, ''); }
  function metaText(m) {
    if (!m) return 'no tensor';
    var t = m.dtype + '[' + m.shape.join(', ') + '] stride=[' + m.stride.join(', ') + ']';
    if (m.offset !== 0 && m.offset !== '0') t += ' offset=' + m.offset;
    if (m.device && m.device !== 'cpu') t += ' ' + m.device;
    if (m.bits) t += ' ' + m.bits;
    return t;
  }
  function value(G, M, k) {  // a value as this mode's graph has it (the alias pass may rewrite)
    var v = G.values[k], c = M.changed_values && M.changed_values[k];
    if (!c) return v;
    return { name: v.name, producer: v.producer, role: v.role, output: v.output, meta: c.meta, root: c.root };
  }
  function nodeOp(G, M, i) { return (M.changed_nodes && M.changed_nodes[i]) || G.nodes[i].op; }
  function valueText(G, M, k) {
    var v = value(G, M, k), t = '%' + v.name + '  ' + metaText(v.meta);
    if (v.root) t += '  view of %' + v.root;
    if (v.role) t += '  (graph input' + (v.role !== 'user' ? ', ' + v.role : '') + ')';
    if (v.output) t += '  (graph output)';
    return t;
  }
  function segLabel(M, i) { var g = M.segments[i]; return g.name + ' ' + g.kind.toUpperCase(); }

  // ---- layout (Note [page layout] in perf/tools/html/data.py: layers come with the data) ------------
  function innerLayout(seg) {
    var rows = [], byLayer = {};
    seg.nodes.forEach(function (n, k) { (byLayer[seg.node_layer[k]] = byLayer[seg.node_layer[k]] || []).push(k); });
    Object.keys(byLayer).map(Number).sort(function (a, b) { return a - b; }).forEach(function (lay) {
      var ks = byLayer[lay].sort(function (a, b) { return seg.node_order[a] - seg.node_order[b]; });
      for (var i = 0; i < ks.length; i += NODES_PER_ROW) rows.push(ks.slice(i, i + NODES_PER_ROW));
    });
    var width = 0, pos = new Array(seg.nodes.length);
    rows.forEach(function (row, r) {
      width = Math.max(width, row.length * (NODE_W + 8) - 8);
      row.forEach(function (k, c) { pos[k] = [PAD + c * (NODE_W + 8), HEAD + 8 + r * (NODE_H + 12)]; });
    });
    return { w: Math.max(SEG_W, width + 2 * PAD), h: HEAD + 8 + rows.length * (NODE_H + 12) + PAD - 12 + 8, pos: pos };
  }
  function layout(M) {
    var segs = M.segments, geo = new Array(segs.length), rows = [];
    segs.forEach(function (g, i) {
      geo[i] = state.expanded.has(i) ? innerLayout(g) : { w: SEG_W, h: SEG_H, pos: null };
      (rows[g.layer] = rows[g.layer] || []).push(i);
    });
    var widths = rows.map(function (row) {
      row.sort(function (a, b) { return segs[a].order - segs[b].order; });
      return row.reduce(function (w, i) { return w + geo[i].w + GAP_X; }, -GAP_X);
    });
    var maxW = Math.max.apply(null, widths.concat([SEG_W])), y = MARGIN;
    rows.forEach(function (row, r) {
      var x = MARGIN + (maxW - widths[r]) / 2, rowH = 0;
      row.forEach(function (i) { geo[i].x = x; geo[i].y = y; x += geo[i].w + GAP_X; rowH = Math.max(rowH, geo[i].h); });
      y += rowH + GAP_Y;
    });
    return { geo: geo, width: maxW + 2 * MARGIN, height: y - GAP_Y + MARGIN };
  }

  // ---- drawing ---------------------------------------------------------------------------------
  function curve(x1, y1, x2, y2) {
    var dy = Math.max(20, (y2 - y1) / 2);
    return 'M' + x1 + ',' + y1 + ' C' + x1 + ',' + (y1 + dy) + ' ' + x2 + ',' + (y2 - dy) + ' ' + x2 + ',' + y2;
  }
  function edgePairs(M) {  // boundaries grouped by (producer, consumer): one drawn edge each
    var pairs = new Map();
    M.boundaries.forEach(function (b, k) {
      var key = b.producer + '>' + b.consumer, p = pairs.get(key);
      if (!p) pairs.set(key, p = { producer: b.producer, consumer: b.consumer, items: [] });
      p.items.push(k);
    });
    return Array.from(pairs.values());
  }
  function draw() {
    var G = DATA.graphs[state.graph], M = G.modes[state.mode], lay = layout(M), geo = lay.geo;
    var svg = s('svg', { id: 'graph', width: lay.width, height: lay.height, 'data-shown-mode': M.mode });
    var edges = s('g', { 'class': 'edges' }), segsG = s('g', { 'class': 'segs' });
    M.edges = M.edges || edgePairs(M);
    M.edges.forEach(function (p, k) {
      var a = geo[p.producer], b = geo[p.consumer];
      var reasons = p.items.map(function (j) { return M.boundaries[j].reason; });
      var cls = 'edge' + (reasons.indexOf(state.reason) >= 0 ? ' hl' : '');
      edges.appendChild(s('path', { 'class': cls, 'data-edge': k, d: curve(a.x + a.w / 2, a.y + a.h, b.x + b.w / 2, b.y) }));
    });
    var hits = searchHits();
    M.segments.forEach(function (g, i) {
      var p = geo[i], open = state.expanded.has(i);
      var cls = 'seg k-' + g.kind + (open ? ' open' : '') + (hits.segs.has(i) ? ' hit' : '') +
        (state.selected && state.selected.seg === i && state.selected.node === undefined ? ' sel' : '');
      var grp = s('g', { 'class': cls, 'data-seg': i, 'data-kind': g.kind, 'data-nodes': g.nodes.length,
        transform: 'translate(' + p.x + ',' + p.y + ')' });
      grp.appendChild(s('rect', { 'class': 'box', width: p.w, height: p.h }));
      grp.appendChild(s('rect', { 'class': 'band', width: p.w, height: HEAD - 4, rx: 6 }));
      grp.appendChild(s('text', { 'class': 't1', x: 8, y: 15 }, g.name + ' ' + g.kind.toUpperCase()));
      grp.appendChild(s('text', { 'class': 'tog', x: p.w - 18, y: 15, 'data-toggle': i }, open ? '\u2212' : '+'));
      if (!open) {
        var sub = g.nodes.length + (g.nodes.length === 1 ? ' op' : ' ops') + ' \u00b7 ' +
          (g.launches ? bytes(g.bytes_moved) : 'no launch');
        if (g.nodes.length === 1) sub = shortOp(nodeOp(G, M, g.nodes[0])) + ' \u00b7 ' + (g.launches ? bytes(g.bytes_moved) : 'no launch');
        grp.appendChild(s('text', { 'class': 't2', x: 8, y: 39 }, sub.length > 34 ? sub.slice(0, 33) + '\u2026' : sub));
      } else {
        drawInner(G, M, g, p, grp, hits);
      }
      segsG.appendChild(grp);
    });
    svg.appendChild(edges);
    svg.appendChild(segsG);
    var canvas = document.getElementById('canvas');
    var old = document.getElementById('graph');
    if (old) canvas.replaceChild(svg, old); else canvas.appendChild(svg);
    current = { G: G, M: M, geo: geo, svg: svg };
    document.body.setAttribute('data-shown-mode', M.mode);
    document.body.setAttribute('data-segments', String(M.segments.length));
  }
  function drawInner(G, M, g, p, grp, hits) {
    var local = new Map();
    g.nodes.forEach(function (n, k) { G.nodes[n].outputs.forEach(function (v) { local.set(v, k); }); });
    g.nodes.forEach(function (n, k) {  // edges inside the segment first, under the nodes
      G.nodes[n].inputs.forEach(function (v) {
        var src = local.get(v);
        if (src === undefined) return;
        var a = p.pos[src], b = p.pos[k];
        grp.appendChild(s('path', { 'class': 'inner', d: curve(a[0] + NODE_W / 2, a[1] + NODE_H, b[0] + NODE_W / 2, b[1]) }));
      });
    });
    g.nodes.forEach(function (n, k) {
      var node = G.nodes[n], op = shortOp(nodeOp(G, M, n));
      var sel = state.selected && state.selected.node === n;
      var ng = s('g', { 'class': 'node v-' + node.kind + (hits.nodes.has(n) ? ' hit' : '') + (sel ? ' sel' : ''),
        'data-node': n, transform: 'translate(' + p.pos[k][0] + ',' + p.pos[k][1] + ')' });
      ng.appendChild(s('rect', { width: NODE_W, height: NODE_H }));
      // captured graphs name nodes after their ops (mul_3: aten.mul.Tensor): the op only where it differs
      var label = node.name.replace(/_\d+$/, '') === op.split('.')[0] ? node.name : node.name + ' \u00b7 ' + op;
      ng.appendChild(s('text', { x: 6, y: 16 }, label.length > 27 ? label.slice(0, 26) + '\u2026' : label));
      grp.appendChild(ng);
    });
  }

  // ---- search ------------------------------------------------------------------------------------
  var hitCache = { key: null, value: null };
  function searchHits() {
    var G = DATA.graphs[state.graph], M = G.modes[state.mode], q = state.query.trim().toLowerCase();
    var key = state.graph + '/' + state.mode + '/' + q;
    if (hitCache.key === key) return hitCache.value;
    var out = { nodes: new Set(), segs: new Set(), list: [] };
    if (q) {
      var segOf = segmentOf(M);
      G.nodes.forEach(function (n, i) {
        if (n.name.toLowerCase().indexOf(q) >= 0 || nodeOp(G, M, i).toLowerCase().indexOf(q) >= 0) {
          out.nodes.add(i); out.segs.add(segOf[i]); out.list.push(i);
        }
      });
      M.segments.forEach(function (g, i) { if (g.name === q) out.segs.add(i); });
    }
    hitCache = { key: key, value: out };
    return out;
  }
  function segmentOf(M) {
    if (!M.segOf) {
      M.segOf = [];
      M.segments.forEach(function (g, i) { g.nodes.forEach(function (n) { M.segOf[n] = i; }); });
    }
    return M.segOf;
  }
  function showResults() {
    var hits = searchHits(), G = DATA.graphs[state.graph], M = G.modes[state.mode], ul = clear(document.getElementById('results'));
    var segOf = segmentOf(M);
    document.getElementById('hitcount').textContent = state.query.trim() ?
      hits.list.length + ' nodes in ' + hits.segs.size + ' segments' : '';
    hits.list.slice(0, LIST_MAX).forEach(function (n) {
      var li = h('li', { 'class': 'link mono', 'data-goto-node': n },
        G.nodes[n].name + '  ' + shortOp(nodeOp(G, M, n)) + '  (' + M.segments[segOf[n]].name + ')');
      ul.appendChild(li);
    });
    if (hits.list.length > LIST_MAX) ul.appendChild(h('li', { 'class': 'note' }, '\u2026 ' + (hits.list.length - LIST_MAX) + ' more'));
  }

  // ---- side panels ---------------------------------------------------------------------------------
  function kv(pairs) {
    var dl = h('dl', { 'class': 'kv' });
    pairs.forEach(function (p) { dl.appendChild(h('dt', null, p[0])); dl.appendChild(h('dd', null, p[1])); });
    return dl;
  }
  function bar(frac, cls) {
    var b = h('div', { 'class': 'bar' }), i = h('i', cls ? { 'class': cls } : null);
    i.style.width = Math.max(0.5, Math.min(100, frac * 100)).toFixed(1) + '%';
    b.appendChild(i);
    return b;
  }
  function list(title, items, render) {
    var wrap = h('div');
    if (!items.length) return wrap;
    wrap.appendChild(h('h2', null, title + ' (' + items.length + ')'));
    var ul = h('ul', { 'class': 'plain' });
    items.slice(0, LIST_MAX).forEach(function (it) { ul.appendChild(render(it)); });
    if (items.length > LIST_MAX) ul.appendChild(h('li', { 'class': 'note' }, '\u2026 ' + (items.length - LIST_MAX) + ' more'));
    wrap.appendChild(ul);
    return wrap;
  }
  function aliasOf(M, origin) {
    if (!M.alias || origin === undefined || origin === null) return null;
    for (var i = 0; i < M.alias.segments.length; i++) if (M.alias.segments[i].segment === origin) return M.alias.segments[i];
    return null;
  }
  function aliasLines(G, M, r) {
    var out = [];
    var vname = function (v) { return typeof v === 'number' ? '%' + G.values[v].name : '%' + v; };
    r.views_of_inputs.forEach(function (p) { out.push(vname(p[0]) + ' is a view of input %' + p[1] + ': metadata, no launch'); });
    r.views_of_outputs.forEach(function (p) { out.push(vname(p[0]) + ' is a view of %' + p[1] + ', which the kernel writes: metadata after it'); });
    r.kept.forEach(function (p) { out.push(vname(p[0]) + ' stays a copy: ' + p[1]); });
    return out;
  }
  function showSegment(i) {
    var G = DATA.graphs[state.graph], M = G.modes[state.mode], g = M.segments[i], box = clear(document.getElementById('details'));
    var total = M.stats.bytes_moved || 1;
    box.appendChild(h('h2', null, segLabel(M, i) + (g.launches ? '' : ' (no launch)')));
    var pairs = [['ops', String(g.nodes.length)], ['bytes read', bytes(g.bytes_read)], ['bytes written', bytes(g.bytes_written)],
      ['bytes moved', bytes(g.bytes_moved) + ' (' + (100 * g.bytes_moved / total).toFixed(1) + '% of the plan\'s ' + bytes(M.stats.bytes_moved) + ')']];
    if (g.origin !== undefined && g.origin !== null && M.mode !== 'segmenter') pairs.push(['from', 'segmenter\'s s' + g.origin]);
    box.appendChild(kv(pairs));
    box.appendChild(bar(g.bytes_moved / total));
    var btn = h('button', { 'data-toggle': i }, state.expanded.has(i) ? 'collapse' : 'expand');
    box.appendChild(btn);
    var r = aliasOf(M, g.origin);
    if (r) {
      box.appendChild(h('h2', null, 'alias pass on segmenter\'s s' + r.segment + ': ' + r.kind.toUpperCase() + ' \u2192 ' +
        (r.became.map(function (k) { return k.toUpperCase(); }).join(' + ') || 'nothing')));
      var ul = h('ul', { 'class': 'plain mono' });
      aliasLines(G, M, r).forEach(function (t) { ul.appendChild(h('li', null, t)); });
      box.appendChild(ul);
    }
    var incoming = [], outgoing = [];
    M.boundaries.forEach(function (b) { if (b.consumer === i) incoming.push(b); if (b.producer === i) outgoing.push(b); });
    var edgeItem = function (b, other) {
      var li = h('li', { 'class': 'reason' });
      li.appendChild(h('span', { 'class': 'link mono', 'data-goto-seg': other }, M.segments[other].name));
      li.appendChild(document.createTextNode(' %' + G.values[b.value].name + ': ' + G.reasons[b.reason]));
      return li;
    };
    box.appendChild(list('cut above: read from', incoming, function (b) { return edgeItem(b, b.producer); }));
    box.appendChild(list('cut below: read by', outgoing, function (b) { return edgeItem(b, b.consumer); }));
    box.appendChild(list('inputs', g.inputs, function (v) { return h('li', { 'class': 'mono' }, valueText(G, M, v)); }));
    box.appendChild(list('outputs', g.outputs, function (v) { return h('li', { 'class': 'mono' }, valueText(G, M, v)); }));
    box.appendChild(list('ops', g.nodes, function (n) {
      return h('li', { 'class': 'link mono', 'data-goto-node': n }, G.nodes[n].name + '  ' + shortOp(nodeOp(G, M, n)));
    }));
  }
  function showNode(n) {
    var G = DATA.graphs[state.graph], M = G.modes[state.mode], node = G.nodes[n], box = clear(document.getElementById('details'));
    var seg = segmentOf(M)[n];
    box.appendChild(h('h2', null, node.name + ': ' + nodeOp(G, M, n)));
    box.appendChild(kv([['op kind', node.kind], ['segment', segLabel(M, seg)]]));
    var go = h('button', { 'data-goto-seg': seg }, 'show ' + M.segments[seg].name);
    box.appendChild(go);
    box.appendChild(list('inputs', node.inputs, function (v) { return h('li', { 'class': 'mono' }, valueText(G, M, v)); }));
    box.appendChild(list('outputs', node.outputs, function (v) { return h('li', { 'class': 'mono' }, valueText(G, M, v)); }));
  }
  function showSummary() {
    var G = DATA.graphs[state.graph], M = G.modes[state.mode], box = clear(document.getElementById('summary'));
    var keys = ['segments', 'kernels', 'opaque', 'launches', 'metadata', 'bytes_moved', 'bytes_floor'];
    var t = h('table', { 'class': 'modes' }), head = h('tr');
    head.appendChild(h('th', null, 'alias mode'));
    G.modes.forEach(function (m, k) { head.appendChild(h('th', { 'class': 'link' + (k === state.mode ? ' active' : ''), 'data-mode': k }, m.mode)); });
    t.appendChild(head);
    keys.forEach(function (key) {
      var tr = h('tr');
      tr.appendChild(h('td', null, key.replace('_', ' ')));
      G.modes.forEach(function (m) { var x = m.stats[key]; tr.appendChild(h('td', null, key.indexOf('bytes') === 0 ? bytes(x) : String(x))); });
      t.appendChild(tr);
    });
    box.appendChild(h('h2', null, 'alias modes side by side'));
    box.appendChild(t);
    box.appendChild(h('p', { 'class': 'note' }, M.mode + ': ' + M.note));
    G.sizes.forEach(function (line) { box.appendChild(h('p', { 'class': 'note mono' }, line)); });
    var st = M.stats, top = Math.max(st.bytes_moved, st.bytes_floor, 1);
    box.appendChild(h('div', { 'class': 'note' }, 'bytes moved ' + bytes(st.bytes_moved) + ' against the floor ' + bytes(st.bytes_floor) +
      (st.bytes_floor ? ' (' + (st.bytes_moved / st.bytes_floor).toFixed(2) + '\u00d7)' : '')));
    box.appendChild(bar(st.bytes_moved / top));
    box.appendChild(bar(st.bytes_floor / top, 'floor'));
    box = clear(document.getElementById('bytes'));
    var order = M.segments.map(function (g, i) { return i; }).filter(function (i) { return M.segments[i].bytes_moved > 0; })
      .sort(function (a, b) { return M.segments[b].bytes_moved - M.segments[a].bytes_moved; }).slice(0, 12);
    var ul = h('ul', { 'class': 'plain' }), most = order.length ? M.segments[order[0]].bytes_moved : 1;
    order.forEach(function (i) {
      var li = h('li');
      li.appendChild(h('span', { 'class': 'link mono', 'data-goto-seg': i }, segLabel(M, i)));
      li.appendChild(h('span', { 'class': 'count' }, '  ' + bytes(M.segments[i].bytes_moved) + ' (' +
        (100 * M.segments[i].bytes_moved / (st.bytes_moved || 1)).toFixed(1) + '%)'));
      li.appendChild(bar(M.segments[i].bytes_moved / most));
      ul.appendChild(li);
    });
    if (order.length) box.appendChild(h('h2', null, 'segments moving the most bytes'));
    box.appendChild(ul);
  }
  function showBoundaries() {
    var G = DATA.graphs[state.graph], M = G.modes[state.mode], box = clear(document.getElementById('boundaries'));
    var counts = new Map();
    M.boundaries.forEach(function (b) { counts.set(b.reason, (counts.get(b.reason) || 0) + 1); });
    box.appendChild(h('h2', null, 'boundaries: ' + M.boundaries.length + ' values cross a cut'));
    box.appendChild(h('p', { 'class': 'note' }, 'why each pair of segments was not merged; click a reason to mark its edges'));
    Array.from(counts.entries()).sort(function (a, b) { return b[1] - a[1]; }).forEach(function (e) {
      var li = h('div', { 'class': 'reason link' + (e[0] === state.reason ? ' hl' : ''), 'data-reason': e[0] });
      li.appendChild(h('span', { 'class': 'count' }, e[1] + '\u00d7 '));
      li.appendChild(document.createTextNode(G.reasons[e[0]]));
      box.appendChild(li);
    });
  }
  function showAlias() {
    var G = DATA.graphs[state.graph], M = G.modes[state.mode], box = clear(document.getElementById('alias'));
    if (!M.alias) { box.appendChild(h('h2', null, 'alias pass: none in this mode')); return; }
    var a = M.alias;
    box.appendChild(h('h2', null, 'alias pass (' + M.mode + '): kernels ' + a.kernels_before + ' \u2192 ' + a.kernels_after +
      ', metadata segments ' + a.metadata_after));
    box.appendChild(list('segments it looked into', a.segments, function (r) {
      var li = h('li', { 'class': 'reason' });
      li.appendChild(h('div', { 'class': 'mono' }, 's' + r.segment + ' ' + r.kind.toUpperCase() + ' \u2192 ' +
        (r.became.map(function (k) { return k.toUpperCase(); }).join(' + ') || 'nothing')));
      var ul = h('ul', { 'class': 'mono' });
      aliasLines(G, M, r).forEach(function (t) { ul.appendChild(h('li', null, t)); });
      li.appendChild(ul);
      return li;
    }));
    box.appendChild(list('copies elided', a.elided, function (p) {
      return h('li', { 'class': 'mono' }, '%' + (typeof p[0] === 'number' ? G.values[p[0]].name : p[0]) + ': ' + p[1]);
    }));
  }
  function showHint() {
    clear(document.getElementById('details')).appendChild(h('p', { 'class': 'note' },
      'Click a segment for its ops, values, bytes, cuts and what the alias pass did there; + expands it. ' +
      'Hover a node for its op, shape, strides, dtype and alias root, an edge for why the cut is there.'));
  }
  function plural(n, word) { return n + ' ' + word + (n === 1 ? '' : 's'); }
  function showTabs() {
    var G = DATA.graphs[state.graph], tabs = clear(document.getElementById('tabs'));
    G.modes.forEach(function (m, k) {
      var b = h('button', { 'class': 'tab' + (k === state.mode ? ' active' : ''), 'data-mode': k }, m.mode);
      b.appendChild(h('span', { 'class': 'sub' }, plural(m.stats.kernels, 'kernel') + ' \u00b7 ' + m.stats.metadata + ' metadata \u00b7 ' +
        bytes(m.stats.bytes_moved)));
      tabs.appendChild(b);
    });
    document.getElementById('graph-info').textContent = G.name + ': ' + G.nodes.length + ' nodes, ' +
      G.inputs.length + ' inputs, ' + G.outputs.length + ' outputs';
  }
  function showTable() {
    var box = document.getElementById('table');
    if (!DATA.table || !DATA.table.length) { box.hidden = true; return; }
    var cols = Object.keys(DATA.table[0]), t = h('table'), head = h('tr');
    cols.forEach(function (c) { head.appendChild(h('th', null, c)); });
    t.appendChild(head);
    DATA.table.forEach(function (row) {
      var tr = h('tr');
      cols.forEach(function (c) { tr.appendChild(h('td', null, row[c] === null ? '' : String(row[c]))); });
      t.appendChild(tr);
    });
    box.appendChild(t);
  }

  // ---- state changes -------------------------------------------------------------------------------
  function refresh() { draw(); showSummary(); showBoundaries(); showAlias(); showResults(); }
  function setMode(k) {
    state.mode = k; state.expanded = new Set(); state.selected = null; state.reason = -1;
    showTabs(); refresh(); showHint(); saveHash();
  }
  function initialMode(G) {
    for (var k = 0; k < G.modes.length; k++) if (G.modes[k].mode === G.initial_mode) return k;
    return 0;
  }
  function setGraph(k) { state.graph = k; setMode(initialMode(DATA.graphs[k])); }
  function scrollTo(x, y) {
    var c = document.getElementById('canvas');
    c.scrollLeft = Math.max(0, x - c.clientWidth / 2); c.scrollTop = Math.max(0, y - c.clientHeight / 3);
  }
  function toggle(i) {
    if (state.expanded.has(i)) state.expanded.delete(i); else state.expanded.add(i);
    var c = document.getElementById('canvas'), before = current.geo[i];
    var dx = before.x - c.scrollLeft, dy = before.y - c.scrollTop;
    draw();
    var after = current.geo[i];  // keep the box where it was on the screen
    c.scrollLeft = after.x - dx; c.scrollTop = after.y - dy;
    if (state.selected && state.selected.seg === i && state.selected.node === undefined) showSegment(i);
    saveHash();
  }
  function markSelected() {  // the selection's classes only: no redraw of 10^4 groups for a click
    Array.prototype.forEach.call(current.svg.querySelectorAll('.sel'), function (e) { e.classList.remove('sel'); });
    var sel = state.selected, e = null;
    if (sel && sel.node !== undefined) e = current.svg.querySelector('g.node[data-node="' + sel.node + '"]');
    else if (sel) e = current.svg.querySelector('g.seg[data-seg="' + sel.seg + '"]');
    if (e) e.classList.add('sel');
  }
  function selectSeg(i, scroll) {
    state.selected = { seg: i }; markSelected(); showSegment(i);
    if (scroll) { var p = current.geo[i]; scrollTo(p.x + p.w / 2, p.y); }
    saveHash();
  }
  function selectNode(n, scroll) {
    var seg = segmentOf(current.M)[n];
    state.selected = { seg: seg, node: n };
    if (!state.expanded.has(seg)) { state.expanded.add(seg); draw(); } else markSelected();
    showNode(n);
    if (scroll) {
      var p = current.geo[seg], k = current.M.segments[seg].nodes.indexOf(n);
      scrollTo(p.x + p.pos[k][0] + NODE_W / 2, p.y + p.pos[k][1]);
    }
    saveHash();
  }
  function saveHash() {
    var parts = ['mode=' + encodeURIComponent(current.M.mode)];
    if (DATA.graphs.length > 1) parts.unshift('graph=' + state.graph);
    if (state.expanded.size) parts.push('expand=' + Array.from(state.expanded).join(','));
    if (state.query) parts.push('search=' + encodeURIComponent(state.query));
    if (state.selected) parts.push('select=' + (state.selected.node !== undefined ? 'n' + state.selected.node : 's' + state.selected.seg));
    try { history.replaceState(null, '', '#' + parts.join('&')); } catch (e) { /* file:// in some browsers */ }
  }
  function loadHash() {  // #graph=K&mode=NAME&expand=all|1,2&search=TEXT&select=sI|nI
    var q = {};
    location.hash.replace(/^#/, '').split('&').forEach(function (kv) {
      var i = kv.indexOf('=');
      if (i > 0) q[kv.slice(0, i)] = decodeURIComponent(kv.slice(i + 1));
    });
    if (q.graph !== undefined && DATA.graphs[+q.graph]) state.graph = +q.graph;
    var G = DATA.graphs[state.graph];
    state.mode = initialMode(G);
    G.modes.forEach(function (m, k) { if (m.mode === q.mode) state.mode = k; });
    var M = G.modes[state.mode];
    if (q.expand === 'all') M.segments.forEach(function (g, i) { state.expanded.add(i); });
    else if (q.expand) q.expand.split(',').forEach(function (x) { if (M.segments[+x]) state.expanded.add(+x); });
    if (q.search) { state.query = q.search; document.getElementById('search').value = q.search; }
    return q.select || null;
  }

  // ---- events ----------------------------------------------------------------------------------------
  function closestData(t, name) {
    while (t && t.getAttribute) {
      if (t.hasAttribute(name)) return t.getAttribute(name);
      t = t.parentNode;
    }
    return null;
  }
  function onClick(e) {
    var t = e.target, v;
    if ((v = closestData(t, 'data-toggle')) !== null) { toggle(+v); return; }
    if ((v = closestData(t, 'data-goto-node')) !== null) { selectNode(+v, true); return; }
    if ((v = closestData(t, 'data-goto-seg')) !== null) { selectSeg(+v, true); return; }
    if ((v = closestData(t, 'data-mode')) !== null && t.closest && !t.closest('svg')) { setMode(+v); return; }
    if ((v = closestData(t, 'data-reason')) !== null) {
      state.reason = state.reason === +v ? -1 : +v; draw(); showBoundaries(); return;
    }
    if ((v = closestData(t, 'data-node')) !== null) { selectNode(+v, false); return; }
    if ((v = closestData(t, 'data-seg')) !== null) { selectSeg(+v, false); }
  }
  function tipText(t) {
    var G = current.G, M = current.M, v;
    if ((v = closestData(t, 'data-node')) !== null) {
      var n = +v, node = G.nodes[n], lines = [node.name + ': ' + nodeOp(G, M, n) + ' (' + node.kind + ')'];
      node.outputs.forEach(function (o) { lines.push('out ' + valueText(G, M, o)); });
      node.inputs.forEach(function (o) { lines.push('in  ' + valueText(G, M, o)); });
      return lines.join('\n');
    }
    if ((v = closestData(t, 'data-edge')) !== null) {
      var p = M.edges[+v];
      return [M.segments[p.producer].name + ' \u2192 ' + M.segments[p.consumer].name].concat(p.items.slice(0, 8).map(function (j) {
        var b = M.boundaries[j];
        return '%' + G.values[b.value].name + ': ' + G.reasons[b.reason];
      })).concat(p.items.length > 8 ? ['\u2026 ' + (p.items.length - 8) + ' more'] : []).join('\n');
    }
    if ((v = closestData(t, 'data-seg')) !== null) {
      var g = M.segments[+v];
      return segLabel(M, +v) + ': ' + g.nodes.length + ' ops, ' + (g.launches ? bytes(g.bytes_moved) + ' moved' : 'no launch') +
        '\n' + g.nodes.slice(0, 6).map(function (n) { return shortOp(nodeOp(G, M, n)); }).join(', ') + (g.nodes.length > 6 ? ', \u2026' : '') +
        '\nclick: details, +: expand';
    }
    return null;
  }
  function onMove(e) {
    var tip = document.getElementById('tip'), text = tipText(e.target);
    if (!text) { tip.hidden = true; return; }
    tip.textContent = text; tip.hidden = false;
    var x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    var y = e.clientY + 16 + tip.offsetHeight > window.innerHeight ? e.clientY - tip.offsetHeight - 8 : e.clientY + 16;
    tip.style.left = x + 'px'; tip.style.top = y + 'px';
  }

  function init() {
    document.title = DATA.title;
    document.getElementById('title').textContent = DATA.title;
    var legend = document.getElementById('legend');
    KINDS.forEach(function (k) { legend.appendChild(h('span', { 'class': 'k-' + k }, k.toUpperCase())); });
    legend.appendChild(h('em', { 'class': 'note' }, 'dashed: no launch (metadata segment, view op)'));
    var pick = document.getElementById('graphs');
    if (DATA.graphs.length > 1) {
      DATA.graphs.forEach(function (G, k) { pick.appendChild(h('option', { value: k }, G.name)); });
      pick.hidden = false;
      pick.addEventListener('change', function () { setGraph(+pick.value); });
    }
    if (!DATA.graphs.length) { document.getElementById('graph-info').textContent = 'no graphs'; document.body.setAttribute('data-ready', '1'); return; }
    var select = loadHash();
    pick.value = String(state.graph);
    showTable(); showTabs(); refresh(); showHint();
    if (select && select[0] === 's' && current.M.segments[+select.slice(1)]) selectSeg(+select.slice(1), true);
    else if (select && select[0] === 'n' && current.G.nodes[+select.slice(1)]) selectNode(+select.slice(1), true);
    document.addEventListener('click', onClick);
    var canvas = document.getElementById('canvas');
    canvas.addEventListener('mousemove', onMove);
    canvas.addEventListener('mouseleave', function () { document.getElementById('tip').hidden = true; });
    var timer = null, search = document.getElementById('search');
    search.addEventListener('input', function () {
      clearTimeout(timer);
      timer = setTimeout(function () { state.query = search.value; draw(); showResults(); saveHash(); }, 150);
    });
    search.addEventListener('keydown', function (e) {
      if (e.key !== 'Enter') return;
      state.query = search.value; var hits = searchHits();
      if (hits.list.length) selectNode(hits.list[0], true);
      showResults();
    });
    document.getElementById('collapse-all').addEventListener('click', function () { state.expanded = new Set(); draw(); saveHash(); });
    document.getElementById('expand-all').addEventListener('click', function () {
      current.M.segments.forEach(function (g, i) { state.expanded.add(i); }); draw(); saveHash();
    });
    document.body.setAttribute('data-render-ms', String(Math.round(performance.now() - T0)));
    document.body.setAttribute('data-ready', '1');
  }
  try { init(); } catch (e) { reportError('script error: ' + (e && e.stack ? e.stack : e)); }
})();
