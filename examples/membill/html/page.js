// membill's interactive memory view. Hand-written, no library: the page must open offline from
// one file, and what it needs (a stacked area, a hover read-out, a drag to zoom) is a few hundred
// lines, smaller than any charting library we could vendor. The data is embedded by membill:
// MEMBILL = {report: the JSON report, runs: [{name, meta, t, ph, sites, life, n}]}, where
// life holds one lifetime per tensor (site, category, bytes, first event, event that freed it
// or -1) and t the microseconds between events (empty in meta mode, where no time passes).
'use strict';
(function () {
  const D = window.MEMBILL;
  const CATS = ['weight', 'gradient', 'optimizer', 'activation', 'cache', 'temporary', 'other'];
  const COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#bab0ac'];
  const PHASES = D.phases;
  const NC = CATS.length;
  const $ = (sel, root) => (root || document).querySelector(sel);
  const el = (tag, attrs, text) => {
    const svg = ['svg', 'path', 'rect', 'line', 'text', 'g', 'polyline'].includes(tag);
    const e = svg ? document.createElementNS('http://www.w3.org/2000/svg', tag) : document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const commas = (b) => Math.round(b).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  const human = (b) => {
    const a = Math.abs(b);
    if (a >= 1e9) return (b / 1e9).toFixed(2) + ' GB';
    if (a >= 1e6) return (b / 1e6).toFixed(2) + ' MB';
    if (a >= 1e3) return (b / 1e3).toFixed(2) + ' kB';
    return b + ' B';
  };

  // ---- one run: live bytes per category after every event, phases as runs of events ----
  function prepare(run) {
    const n = run.n;
    const live = new Float64Array(n * NC);
    const life = [];
    for (let i = 0; i < run.life.length; i += 5) {
      const l = {site: run.sites[run.life[i]], cat: run.life[i + 1], bytes: run.life[i + 2],
                 start: run.life[i + 3], end: run.life[i + 4]};
      life.push(l);
      live[l.start * NC + l.cat] += l.bytes;
      if (l.end >= 0) live[l.end * NC + l.cat] -= l.bytes;
    }
    for (let e = 1; e < n; e++)
      for (let c = 0; c < NC; c++) live[e * NC + c] += live[(e - 1) * NC + c];
    const secs = new Float64Array(n);
    let acc = 0;
    for (let e = 0; e < n && run.t.length; e++) secs[e] = (acc += run.t[e]) / 1e6;
    const phases = [];
    for (let i = 0; i < run.ph.length; i += 2) {
      const first = run.ph[i + 1], last = i + 2 < run.ph.length ? run.ph[i + 3] - 1 : n - 1;
      phases.push({name: PHASES[run.ph[i]], first, last});
    }
    const peaks = {};
    CATS.forEach((c, k) => { peaks[k] = 0; for (let e = 0; e < n; e++) peaks[k] = Math.max(peaks[k], live[e * NC + k]); });
    return Object.assign({}, run, {live, life, secs, phases, catPeak: peaks});
  }

  const runs = D.runs.map(prepare);
  const state = {
    axis: runs.every((r) => !r.meta) ? 'time' : 'event',
    scale: 'linear',
    on: CATS.map(() => true),
    layout: 'side',
    view: null, // [x0, x1] in the axis's units; null: the whole run
    pin: null,  // {chart, x} while a moment is pinned
  };
  const normalised = () => runs.length > 1;

  function xOf(run, e) {
    const x = state.axis === 'time' ? run.secs[e] : e;
    return normalised() ? x / span(run) : x;
  }
  function span(run) {
    const raw = state.axis === 'time' ? run.secs[run.n - 1] : run.n - 1;
    return raw > 0 ? raw : 1;
  }
  function fullView() {
    return normalised() ? [0, 1] : [0, Math.max(...runs.map(span))];
  }
  const view = () => state.view || fullView();
  function total(run, e, cats) {
    let t = 0;
    for (const c of cats) t += run.live[e * NC + c];
    return t;
  }
  const visible = () => CATS.map((_, c) => c).filter((c) => state.on[c]);

  // For every pixel column, the event with the highest total among those that fall in it (so that
  // no peak is lost), or the last event before it when none does: what was live there.
  function columns(run, ncols) {
    const [x0, x1] = view();
    const cats = visible();
    const cols = new Int32Array(ncols).fill(-1);
    const best = new Float64Array(ncols).fill(-1);
    for (let e = 0; e < run.n; e++) {
      const x = xOf(run, e);
      if (x > x1) break;
      let col = Math.floor(((x - x0) / (x1 - x0)) * ncols);
      if (col >= ncols) col = ncols - 1;
      if (col < 0) { cols[0] = e; best[0] = -2; continue; } // the state carried into the view
      const t = total(run, e, cats);
      if (best[col] < 0 || t > best[col]) { best[col] = t; cols[col] = e; }
    }
    let lastEv = -1;
    for (let i = 0; i < ncols; i++) {
      if (cols[i] < 0) cols[i] = lastEv;
      else lastEv = lastOf(run, i, ncols, cols[i]);
    }
    return cols;
  }
  // The last event in column i (what stays live after it), from the representative one on.
  function lastOf(run, i, ncols, e) {
    const [x0, x1] = view();
    while (e + 1 < run.n && Math.floor(((xOf(run, e + 1) - x0) / (x1 - x0)) * ncols) <= i) e++;
    return e;
  }

  // ---- the chart: stacked areas, phases, axes, hover, pin, drag to zoom ----
  const H = 360, TOP = 78, LEFT = 78, RIGHT = 14, BOTTOM = 44;
  function yScale(maxv, h, y0) {
    if (state.scale === 'log') {
      const lo = 1e3, hi = Math.max(maxv, 1e4);
      const f = (v) => y0 + h - (Math.log10(Math.max(v, lo)) - 3) / (Math.log10(hi) - 3) * h;
      f.ticks = []; for (let p = 3; p <= Math.ceil(Math.log10(hi)); p++) if (10 ** p <= hi) f.ticks.push(10 ** p);
      return f;
    }
    const f = (v) => y0 + h - (v / maxv) * h;
    f.ticks = niceTicks(maxv);
    return f;
  }
  function niceTicks(max) {
    const raw = max / 5, p = 10 ** Math.floor(Math.log10(raw || 1));
    const step = raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
    const t = []; for (let v = 0; v <= max; v += step) t.push(v);
    return t;
  }
  // Stack order: largest category at the bottom on a linear scale; on a log scale the smallest,
  // so that a 1 MB band is not drawn between 2.0 and 2.001 GB where a log axis cannot show it.
  function stackOrder(run) {
    const cats = visible();
    if (state.scale === 'log') cats.sort((a, b) => run.catPeak[a] - run.catPeak[b]);
    return cats;
  }
  // The split scale's lower panel: what comes and goes within a step (activations, the KV cache,
  // temporaries, malloc), on a scale of its own, below the weights and state that dwarf it.
  const TRANSIENT = ['activation', 'cache', 'temporary', 'other'].map((c) => CATS.indexOf(c));
  function smallCats() {
    return visible().filter((c) => TRANSIENT.includes(c));
  }
  function sharedMax(cats) {
    let m = 1;
    for (const run of runs) {
      const cs = cats ? cats(run) : visible();
      for (let e = 0; e < run.n; e++) m = Math.max(m, total(run, e, cs));
    }
    return m * 1.05;
  }

  function drawAreas(g, run, cols, order, y, style) {
    const base = new Float64Array(cols.length);
    for (const c of order) {
      let top = '', bottom = '';
      for (let i = 0; i < cols.length; i++) {
        const v = cols[i] < 0 ? 0 : run.live[cols[i] * NC + c];
        top += (i ? 'L' : 'M') + (LEFT + i + 0.5) + ',' + y(base[i] + v).toFixed(1);
        base[i] += v;
      }
      for (let i = cols.length - 1; i >= 0; i--) {
        const v = cols[i] < 0 ? 0 : run.live[cols[i] * NC + c];
        bottom += 'L' + (LEFT + i + 0.5) + ',' + y(base[i] - v).toFixed(1);
      }
      const attrs = {d: top + bottom + 'Z', 'data-cat': CATS[c], 'data-run': run.name};
      if (style === 'outline') Object.assign(attrs, {fill: 'none', stroke: COLORS[c], 'stroke-width': 2, 'stroke-dasharray': '5 3'});
      else Object.assign(attrs, {fill: COLORS[c], 'fill-opacity': 0.85, stroke: COLORS[c], 'stroke-width': 0.5});
      g.appendChild(el('path', attrs));
    }
  }

  function drawYAxis(svg, y, w, label) {
    for (const v of y.ticks) {
      svg.appendChild(el('line', {x1: LEFT, x2: LEFT + w, y1: y(v), y2: y(v), stroke: '#e3e3e3'}));
      svg.appendChild(el('text', {x: LEFT - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'tick'}, human(v)));
    }
    if (!label) return;
    const mid = (y(y.ticks[0]) + y(y.ticks[y.ticks.length - 1])) / 2;
    svg.appendChild(el('text', {x: 14, y: mid, class: 'axis-label', 'text-anchor': 'middle',
                                transform: 'rotate(-90 14 ' + mid + ')'}, label));
  }

  function drawXAxis(svg, w, y0) {
    const [x0, x1] = view();
    for (let i = 0; i <= 5; i++) {
      const x = x0 + ((x1 - x0) * i) / 5;
      const txt = normalised() ? (x * 100).toFixed(0) + '%' : state.axis === 'time' ? x.toFixed(x1 - x0 < 0.1 ? 4 : 2) : Math.round(x);
      svg.appendChild(el('text', {x: LEFT + (w * i) / 5, y: y0 + 16, 'text-anchor': 'middle', class: 'tick'}, txt));
    }
    const name = normalised() ? 'share of each run (' + (state.axis === 'time' ? 'time' : 'events') + ', normalised)'
                 : state.axis === 'time' ? 'seconds into the run' : 'allocations and frees, in order';
    svg.appendChild(el('text', {x: LEFT + w / 2, y: y0 + 34, 'text-anchor': 'middle', class: 'axis-label'}, name));
  }

  // Phases: a shaded band each, the name above the plot; a phase too narrow for its name gets it
  // written upright, nudged off its neighbour's, so that every phase is named however short.
  function drawPhases(svg, run, w, chart) {
    const [x0, x1] = view();
    const px = (x) => LEFT + ((x - x0) / (x1 - x0)) * w;
    let lastLabel = -1e9;
    run.phases.forEach((p, k) => {
      // A phase's band reaches the next phase's first event: the time between is still its own.
      const end = k + 1 < run.phases.length ? run.phases[k + 1].first : p.last;
      const a = Math.max(px(xOf(run, p.first)), LEFT), b = Math.min(px(xOf(run, end)), LEFT + w);
      if (b < LEFT || a > LEFT + w) return;
      svg.appendChild(el('rect', {x: a, y: TOP, width: Math.max(b - a, 0.5), height: H,
                                  fill: k % 2 ? '#f3f3f3' : '#fafafa', class: 'phase-band'}));
      const mid = (a + b) / 2, wide = b - a > p.name.length * 7 + 6;
      let x = wide ? mid : Math.max(mid, lastLabel + 13);
      const t = el('text', {x, y: wide ? TOP - 8 : TOP - 6, class: 'phase-label', 'data-phase': k,
                            'text-anchor': wide ? 'middle' : 'start'}, p.name);
      if (!wide) t.setAttribute('transform', 'rotate(-90 ' + x + ' ' + (TOP - 6) + ')');
      t.addEventListener('click', () => chart.zoomToPhase(run, k));
      svg.appendChild(t);
      if (!wide) svg.appendChild(el('line', {x1: x - 4, x2: mid, y1: TOP - 3, y2: TOP, stroke: '#999'}));
      lastLabel = x;
    });
  }

  class Chart {
    constructor(host, chartRuns, idx) {
      this.runs = chartRuns;
      this.idx = idx;
      this.host = host;
      this.panel = el('div', {class: 'panel', id: 'panel' + idx});
      this.wrap = el('div', {class: 'chart'});
      host.appendChild(this.wrap);
      host.appendChild(this.panel);
    }
    width() { return Math.max(200, Math.floor(this.wrap.clientWidth || 900) - LEFT - RIGHT); }
    render() {
      const w = this.width(), split = state.scale === 'split';
      const hMain = split ? Math.round(H * 0.62) : H, hSmall = H - hMain - 26;
      const svg = el('svg', {width: LEFT + w + RIGHT, height: TOP + H + BOTTOM, class: 'timeline', id: 'chart' + this.idx});
      const [x0, x1] = view();
      this.w = w;
      this.cols = this.runs.map((r) => columns(r, w));
      drawPhases(svg, this.runs[0], w, this);
      const yMain = yScale(sharedMax(), hMain, TOP);
      drawYAxis(svg, yMain, w, 'live bytes');
      const g = el('g');
      this.runs.forEach((r, k) => drawAreas(g, r, this.cols[k], stackOrder(r), yMain, k ? 'outline' : 'fill'));
      if (split) {
        const y0 = TOP + hMain + 26, ySmall = yScale(sharedMax(smallCats), hSmall, y0);
        svg.appendChild(el('text', {x: LEFT, y: y0 - 6, class: 'axis-label'},
                                'activation, cache, temporary, other: on a scale of their own'));
        drawYAxis(svg, ySmall, w);
        this.runs.forEach((r, k) => drawAreas(g, r, this.cols[k], smallCats(r), ySmall, k ? 'outline' : 'fill'));
      }
      svg.appendChild(g);
      drawXAxis(svg, w, TOP + H);
      this.drawPeakMarks(svg, w);
      // The plot area takes the pointer: one pixel column per column of the data.
      const area = el('rect', {x: LEFT, y: TOP, width: w, height: H, fill: 'transparent', class: 'plot-area',
                               'data-x0': x0, 'data-x1': x1, 'data-ncols': w, 'data-axis': state.axis});
      svg.appendChild(area);
      this.cursor = el('line', {y1: TOP, y2: TOP + H, stroke: '#000', 'stroke-width': 1, visibility: 'hidden', class: 'cursor', 'pointer-events': 'none'});
      this.band = el('rect', {y: TOP, height: H, fill: '#4e79a7', 'fill-opacity': 0.15, visibility: 'hidden',
                              'pointer-events': 'none'});
      svg.appendChild(this.cursor);
      svg.appendChild(this.band);
      this.listen(area);
      this.wrap.replaceChildren(svg);
      this.svg = svg;
      if (state.pin && state.pin.chart === this.idx) this.show(this.colOfX(state.pin.x), true);
    }
    drawPeakMarks(svg, w) {
      const [x0, x1] = view();
      this.runs.forEach((r) => {
        const e = r.peakEvent, x = LEFT + ((xOf(r, e) - x0) / (x1 - x0)) * w;
        if (x < LEFT || x > LEFT + w) return;
        svg.appendChild(el('line', {x1: x, x2: x, y1: TOP, y2: TOP + H, stroke: '#000', 'stroke-dasharray': '4 3', class: 'peak-mark'}));
      });
    }
    colOfX(x) {
      const [x0, x1] = view();
      return Math.min(this.w - 1, Math.max(0, Math.floor(((x - x0) / (x1 - x0)) * this.w)));
    }
    xOfCol(col) { const [x0, x1] = view(); return x0 + ((col + 0.5) / this.w) * (x1 - x0); }
    listen(area) {
      let down = null;
      const colAt = (ev) => Math.min(this.w - 1, Math.max(0, Math.floor(ev.clientX - area.getBoundingClientRect().left)));
      area.addEventListener('mousemove', (ev) => {
        const col = colAt(ev);
        if (down !== null && Math.abs(col - down) > 3) {
          this.band.setAttribute('x', LEFT + Math.min(col, down));
          this.band.setAttribute('width', Math.abs(col - down));
          this.band.setAttribute('visibility', 'visible');
        }
        if (!state.pin) this.show(col, false);
      });
      area.addEventListener('mousedown', (ev) => { down = colAt(ev); ev.preventDefault(); });
      area.addEventListener('mouseup', (ev) => {
        const col = colAt(ev), from = down;
        down = null;
        this.band.setAttribute('visibility', 'hidden');
        if (from === null) return;
        if (Math.abs(col - from) > 3) {
          const a = this.xOfCol(Math.min(col, from)) , b = this.xOfCol(Math.max(col, from));
          setView([a, b]);
        } else {
          // Not a re-render: a second click on the same element must still make a double-click.
          state.pin = {chart: this.idx, x: this.xOfCol(col)};
          this.show(col, true);
        }
      });
      area.addEventListener('dblclick', () => { state.pin = null; setView(null); });
    }
    zoomToPhase(run, k) {
      const p = run.phases[k];
      let best = p.first;
      const cats = visible();
      for (let e = p.first; e <= p.last; e++) if (total(run, e, cats) > total(run, best, cats)) best = e;
      const a = xOf(run, p.first), b = xOf(run, p.last);
      const pad = (b - a) * 0.02 || (normalised() ? 1e-4 : state.axis === 'time' ? 1e-5 : 1);
      state.view = [Math.max(0, a - pad), b + pad];
      this.pinEvent(run, best, 'peak of ' + p.name);
    }
    pinEvent(run, e, why) {
      state.pin = {chart: this.idx, x: xOf(run, e), event: e, run: this.runs.indexOf(run), why};
      renderAll();
    }
    // The read-out: every category's live bytes at this column, and the largest live tensors.
    show(col, pinned) {
      const x = LEFT + col + 0.5;
      this.cursor.setAttribute('x1', x); this.cursor.setAttribute('x2', x);
      this.cursor.setAttribute('visibility', 'visible');
      const pin = pinned ? state.pin : null;
      const events = this.runs.map((r, k) => (pin && pin.event !== undefined && pin.run === k ? pin.event : this.cols[k][col]));
      renderPanel(this.panel, this.runs, events, pinned, pin && pin.why);
    }
  }

  function tableOf(run, e) {
    const t = el('table', {class: 'composition', 'data-run': run.name, 'data-event': e});
    t.appendChild(el('caption', {}, run.name));
    let sum = 0;
    CATS.forEach((c, k) => {
      const b = e < 0 ? 0 : run.live[e * NC + k];
      sum += b;
      const tr = el('tr', {'data-cat': c, 'data-bytes': b, class: state.on[k] ? '' : 'off'});
      const sw = el('td'); sw.appendChild(el('span', {class: 'swatch', style: 'background:' + COLORS[k]}));
      tr.append(sw, el('td', {}, c), el('td', {class: 'num'}, commas(b)), el('td', {class: 'num'}, human(b)));
      t.appendChild(tr);
    });
    const tr = el('tr', {'data-cat': 'total', 'data-bytes': sum, class: 'total'});
    tr.append(el('td'), el('td', {}, 'total'), el('td', {class: 'num'}, commas(sum)), el('td', {class: 'num'}, human(sum)));
    t.appendChild(tr);
    return t;
  }
  function whenOf(run, e) {
    const ph = run.phases.find((p) => e >= p.first && e <= p.last);
    const at = state.axis === 'time' && !run.meta ? run.secs[e].toFixed(4) + ' s' : 'event ' + e;
    return at + (ph ? ' (' + ph.name + ')' : '');
  }
  function topLive(run, e, n) {
    const live = run.life.filter((l) => l.bytes > 0 && l.start <= e && (l.end < 0 || l.end > e));
    live.sort((a, b) => b.bytes - a.bytes);
    const t = el('table', {class: 'top-live', 'data-run': run.name});
    const head = el('tr');
    ['site', 'category', 'bytes', 'since'].forEach((h) => head.appendChild(el('th', {}, h)));
    t.appendChild(head);
    live.slice(0, n).forEach((l) => {
      const tr = el('tr', {'data-bytes': l.bytes});
      tr.append(el('td', {class: 'site'}, l.site), el('td', {}, CATS[l.cat]), el('td', {class: 'num'}, human(l.bytes)),
                el('td', {}, whenOf(run, l.start)));
      t.appendChild(tr);
    });
    const more = live.length - n;
    const p = el('p', {class: 'note'}, live.length + ' tensors live' + (more > 0 ? ', the ' + n + ' largest shown' : ''));
    return [t, p];
  }
  function renderPanel(panel, chartRuns, events, pinned, why) {
    const kids = [el('p', {class: 'where'}, (pinned ? 'pinned' + (why ? ' at the ' + why : '') + ': ' : 'at ') +
                        chartRuns.map((r, k) => (events[k] < 0 ? 'before the run' : whenOf(r, events[k]))).join('; '))];
    if (pinned) {
      const b = el('button', {class: 'unpin'}, 'unpin');
      b.addEventListener('click', () => { state.pin = null; renderAll(); });
      kids.push(b);
    }
    const row = el('div', {class: 'tables'});
    chartRuns.forEach((r, k) => row.appendChild(tableOf(r, events[k])));
    kids.push(row);
    chartRuns.forEach((r, k) => { if (events[k] >= 0) kids.push(...topLive(r, events[k], 12)); });
    panel.replaceChildren(...kids);
    panel.dataset.pinned = pinned ? '1' : '0';
  }

  // ---- controls ----
  let charts = [];
  function setView(v) { state.view = v; renderAll(); }
  function renderAll() {
    charts.forEach((c) => c.render());
    if (!state.pin) charts.forEach((c) => c.show(c.colOfX(xOf(c.runs[0], c.runs[0].peakEvent)), false));
    document.body.dataset.view = view().join(',');
  }
  function control(label, name, options, current, onchange, disabled) {
    const box = el('span', {class: 'control'});
    box.appendChild(el('b', {}, label + ' '));
    for (const [value, text] of options) {
      const l = el('label');
      const i = el('input', {type: 'radio', name, value});
      if (value === current) i.checked = true;
      if (disabled && disabled(value)) i.disabled = true;
      i.addEventListener('change', () => onchange(value));
      l.append(i, ' ' + text + ' ');
      box.appendChild(l);
    }
    return box;
  }
  function controls() {
    const bar = $('#controls');
    const meta = runs.some((r) => r.meta);
    bar.appendChild(control('x axis', 'axis', [['time', 'time'], ['event', 'event order']], state.axis,
                            (v) => { state.axis = v; state.view = null; renderAll(); }, (v) => meta && v === 'time'));
    bar.appendChild(control('scale', 'scale', [['linear', 'linear'], ['log', 'log'], ['split', 'split']], state.scale,
                            (v) => { state.scale = v; renderAll(); }));
    if (runs.length > 1)
      bar.appendChild(control('layout', 'layout', [['side', 'side by side'], ['overlay', 'overlaid']], state.layout,
                              (v) => { state.layout = v; build(); }));
    const cats = el('span', {class: 'control', id: 'toggles'});
    cats.appendChild(el('b', {}, 'categories '));
    CATS.forEach((c, k) => {
      const l = el('label', {style: 'border-bottom:3px solid ' + COLORS[k]});
      const i = el('input', {type: 'checkbox', 'data-cat': c});
      i.checked = true;
      i.addEventListener('change', () => { state.on[k] = i.checked; renderAll(); });
      l.append(i, ' ' + c + ' ');
      cats.appendChild(l);
    });
    bar.appendChild(cats);
    const reset = el('button', {id: 'reset-zoom'}, 'reset zoom');
    reset.addEventListener('click', () => setView(null));
    bar.appendChild(reset);
    if (meta) bar.appendChild(el('p', {class: 'note'}, 'a meta run takes no time: its axis is the order of allocations and frees'));
  }
  // The total peak and every phase's peak, one click each.
  function peakButtons() {
    const box = $('#peaks');
    box.replaceChildren();
    charts.forEach((ch) => ch.runs.forEach((r) => {
      const line = el('p', {class: 'peaks'});
      line.appendChild(el('b', {}, r.name + ': '));
      const b = el('button', {class: 'total-peak', 'data-run': r.name}, 'total peak ' + human(total(r, r.peakEvent, CATS.map((_, c) => c))));
      b.addEventListener('click', () => { state.view = null; ch.pinEvent(r, r.peakEvent, 'total peak'); });
      line.appendChild(b);
      r.phases.forEach((p, k) => {
        let best = p.first;
        for (let e = p.first; e <= p.last; e++) if (total(r, e, CATS.map((_, c) => c)) > total(r, best, CATS.map((_, c) => c))) best = e;
        const pb = el('button', {class: 'phase-peak', 'data-phase': p.name, 'data-index': k},
                      p.name + ' ' + human(total(r, best, CATS.map((_, c) => c))));
        pb.addEventListener('click', () => ch.zoomToPhase(r, k));
        line.appendChild(pb);
      });
      box.appendChild(line);
    }));
  }
  function build() {
    const host = $('#charts');
    host.replaceChildren();
    host.className = runs.length > 1 && state.layout === 'side' ? 'side' : '';
    state.pin = null;
    const groups = runs.length > 1 && state.layout === 'side' ? runs.map((r) => [r]) : [runs];
    charts = groups.map((g, k) => {
      const box = el('div', {class: 'chart-box'});
      host.appendChild(box);
      return new Chart(box, g, k);
    });
    peakButtons();
    renderAll();
  }

  // ---- the bill's pictures: four copies, activations by op and block, claims ----
  // The first 16 rows, then the others behind "N more" (said, not dropped); labels are never cut.
  function barRows(host, rows, title, what) {
    if (!rows || !rows.length) return;
    host.appendChild(el('h3', {}, title));
    const max = Math.max(...rows.map((r) => r.bytes));
    const row = (r) => {
      const div = el('div', {class: 'bar-row'});
      const bar = el('span', {class: 'bar', style: 'width:' + ((r.bytes / max) * 60).toFixed(2) + '%'});
      div.append(el('span', {class: 'bar-label'}, r.label), bar, el('span', {class: 'num'}, human(r.bytes)));
      return div;
    };
    const box = el('div', {class: 'bar-rows'});
    rows.slice(0, 16).forEach((r) => box.appendChild(row(r)));
    if (rows.length > 16) {
      const more = el('details', {class: 'more-rows'});
      more.appendChild(el('summary', {}, (rows.length - 16) + ' more ' + what + ' (' + rows.length + ' in all)'));
      rows.slice(16).forEach((r) => more.appendChild(row(r)));
      box.appendChild(more);
    }
    host.appendChild(box);
  }
  function fourCopies(host, f) {
    if (!f) return;
    host.appendChild(el('h3', {}, 'the four copies: weights, gradients and optimizer state against 4 x weights'));
    const peak = f.total_bytes + Math.max(0, f.total_peak_above_bytes || 0);
    const scale = Math.max(peak, f.four_times_weights_bytes) * 1.02;
    const bar = el('div', {class: 'stack', id: 'four-copies'});
    const seg = (bytes, color, label) => {
      if (bytes <= 0) return;
      const s = el('span', {style: 'width:' + ((bytes / scale) * 100).toFixed(3) + '%;background:' + color,
                            title: label + ' ' + commas(bytes) + ' bytes'}, label);
      bar.appendChild(s);
    };
    seg(f.weights_bytes, COLORS[0], 'weights'); seg(f.gradients_bytes, COLORS[1], 'gradients');
    seg(f.optimizer_bytes, COLORS[2], 'optimizer');
    seg(f.total_peak_above_bytes, 'repeating-linear-gradient(45deg,#999,#999 4px,#ccc 4px,#ccc 8px)', 'peak adds');
    const mark = el('span', {class: 'mark', style: 'left:' + ((f.four_times_weights_bytes / scale) * 100).toFixed(3) + '%',
                              title: '4 x weights'});
    bar.appendChild(mark);
    host.appendChild(bar);
    host.appendChild(el('p', {class: 'note'}, 'the three: ' + human(f.total_bytes) + ' = ' + f.ratio_to_weights.toFixed(2) +
                         ' x weights; the marker is 4 x weights (' + human(f.four_times_weights_bytes) + ')' +
                         (f.total_peak_above_bytes > 0 ? '; the real peak adds ' + human(f.total_peak_above_bytes) + ' above them' : '')));
  }
  function claims(host, list) {
    if (!list) return;
    host.appendChild(el('h3', {}, 'claims'));
    const t = el('table', {class: 'claims'});
    const head = el('tr');
    ['id', 'claim', 'expected', 'measured', ''].forEach((h) => head.appendChild(el('th', {}, h)));
    t.appendChild(head);
    for (const c of list) {
      const state = c.pass === null ? 'na' : c.pass ? 'pass' : 'fail';  // null: not measurable on these weights
      const tr = el('tr', {class: state});
      tr.append(el('td', {}, c.id), el('td', {}, c.claim), el('td', {}, c.figure), el('td', {}, c.measured_text),
                el('td', {}, {na: 'n/a', pass: 'pass', fail: 'FAIL'}[state]));
      t.appendChild(tr);
    }
    host.appendChild(t);
  }
  function bill() {
    const host = $('#pictures');
    const rep = D.report || {};
    fourCopies(host, rep.four_copies);
    const b = rep.breakdown || {};
    barRows(host, (b.activation_by_op || []).map((r) => ({label: r.site, bytes: r.bytes})), 'activations at their peak, by op', 'ops');
    barRows(host, (b.activation_by_block || []).map((v, i) => ({label: 'block ' + i, bytes: v})), 'activations at their peak, by block', 'blocks');
    claims(host, rep.claims);
  }

  runs.forEach((r) => {
    r.peakEvent = r.peak_event >= 0 ? r.peak_event : 0;
  });
  if (runs.length) {
    controls();
    build();
  }
  bill();
  window.addEventListener('resize', () => renderAll());
  document.body.dataset.ready = '1';
})();
