// dpledger privacy dashboard. Reads only the JSON API, with the bearer token the
// user pasted (kept in sessionStorage); calls only the endpoints the token's role
// may use, so the page shows exactly what the API grants. No other origin is
// contacted (the server's Content-Security-Policy enforces it).
'use strict';
(function () {
  const KEY = 'dpledger.token';
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);
  const state = {
    claims: null,
    dataset: null,
    charts: {},
    data: {},
    worstHistory: new Map(),
    signature: null,
    exactSignature: null,
    firstRenderMs: null,
    exactRenderMs: null,
    renders: 0,
    refreshMs: Math.max(1, Number(params.get('refresh') || 5)) * 1000,
    timer: null,
  };
  // Read by the browser test; holds nothing the page does not show.
  window.dpDashboard = state;
  let token = null;

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  // ---- formatting -------------------------------------------------------
  function fmt(x) {
    if (x === null || x === undefined || Number.isNaN(x)) return '–';
    if (x === 0) return '0';
    const a = Math.abs(x);
    if (a >= 1e-3 && a < 1e6) return String(Number(x.toPrecision(4)));
    return x.toExponential(3);
  }
  // Axis tick labels with as many significant digits as it takes for
  // neighbouring ticks to read differently (uPlot's default would print
  // 1.5702 and 1.5704 both as 1.57 on a zoomed-in epsilon axis).
  function tickLabels(u, splits) {
    for (let digits = 3; digits <= 12; digits++) {
      const labels = splits.map((v) => (v === null || v === undefined ? '' : precise(v, digits)));
      if (new Set(labels).size === labels.length) return labels;
    }
    return splits.map((v) => String(v));
  }
  function precise(x, digits) {
    if (x === 0) return '0';
    const a = Math.abs(x);
    if (a >= 1e-3 && a < 1e6) return String(Number(x.toPrecision(digits)));
    return x.toExponential(digits - 1);
  }
  function pct(level) {
    return String(Number((level * 100).toPrecision(4))) + '%';
  }
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function table(head, rows) {
    const t = el('table');
    const tr = el('tr');
    head.forEach((h) => tr.appendChild(el('th', h)));
    t.appendChild(tr);
    rows.forEach((r) => {
      const row = el('tr');
      r.forEach((c) => row.appendChild(el('td', c)));
      t.appendChild(row);
    });
    return t;
  }
  function fill(id, ...children) {
    const e = $(id);
    e.replaceChildren(...children);
    return e;
  }
  function show(id, visible) {
    $(id).classList.toggle('hidden', !visible);
  }

  // ---- token --------------------------------------------------------------
  function decodeClaims(t) {
    const parts = t.split('.');
    if (parts.length !== 3) throw new Error('This is not a dpledger token: a token has three dot-separated parts.');
    try {
      const b64 = parts[1].replace(/-/g, '+').replace(/_/g, '/');
      const json = decodeURIComponent(
        atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4))
          .split('')
          .map((c) => '%' + c.charCodeAt(0).toString(16).padStart(2, '0'))
          .join(''),
      );
      const claims = JSON.parse(json);
      if (!claims || typeof claims.role !== 'string') throw new Error('no role');
      return claims;
    } catch (e) {
      throw new Error('This is not a dpledger token: its claims cannot be read.');
    }
  }

  function message(text) {
    fill('message', el('strong', text));
    show('message', !!text);
    if (text) document.body.dataset.state = 'error';
  }

  function showLogin(text) {
    stopRefresh();
    token = null;
    sessionStorage.removeItem(KEY);
    show('dash', false);
    show('forget', false);
    fill('who');
    show('login', true);
    message(text || '');
    if (!text) document.body.dataset.state = 'login';
  }

  // ---- API ----------------------------------------------------------------
  async function api(path) {
    const res = await fetch(path, {
      headers: { Authorization: 'Bearer ' + token, Accept: 'application/json' },
      cache: 'no-store',
      credentials: 'omit',
      referrerPolicy: 'no-referrer',
    });
    if (!res.ok) {
      let detail = res.statusText;
      try {
        const p = await res.json();
        detail = p.detail || p.title || detail;
      } catch (_) {
        /* not a problem document */
      }
      throw new ApiError(res.status, detail);
    }
    return res.json();
  }

  async function pool(items, limit, fn) {
    const out = new Array(items.length);
    let next = 0;
    async function worker() {
      while (next < items.length) {
        const i = next++;
        out[i] = await fn(items[i]);
      }
    }
    await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
    return out;
  }

  const role = () => state.claims.role;
  const curates = () => role() === 'admin' || role() === 'curator';
  // A trainer reads what a viewer reads, and the run's configuration too.
  const readsStatus = () => curates() || role() === 'trainer';
  const base = () => '/v1/datasets/' + encodeURIComponent(state.dataset);

  // ---- charts -------------------------------------------------------------
  const COLORS = ['#2f6fdb', '#d9480f', '#2b8a3e', '#862e9c', '#e67700', '#0b7285', '#c2255c', '#5c940d'];

  function chart(name, opts, data) {
    const host = $('chart-' + name);
    if (state.charts[name]) state.charts[name].destroy();
    host.replaceChildren();
    const width = Math.max(320, host.clientWidth || 900);
    const axes = (opts.axes || []).map((axis) => Object.assign({ values: tickLabels }, axis));
    state.charts[name] = new uPlot(Object.assign({ width, height: 260 }, opts, { axes }), data, host);
    return state.charts[name];
  }

  function lineSeries(label, i, extra) {
    return Object.assign({ label, stroke: COLORS[i % COLORS.length], width: 2, value: (u, v) => fmt(v), points: { show: true, size: 4 } }, extra || {});
  }

  const bars = () => uPlot.paths.bars({ size: [0.9, 80] });

  // ---- sections -----------------------------------------------------------
  function renderWho() {
    const c = state.claims;
    const parts = ['role: ' + c.role];
    if (c.dataset) parts.push('dataset: ' + c.dataset);
    if (c.examples) parts.push((c.examples.length === 1 ? 'example ' : 'examples ') + c.examples.join(', '));
    if (c.exp) parts.push('expires ' + new Date(c.exp * 1000).toISOString().replace('.000', ''));
    fill('who', parts.join(' · '));
    show('forget', true);
  }

  function renderWorst(worst, view, list) {
    // One headline: the smaller of two proven bounds (PLD and RDP), the RDP
    // accountant's figure beside it.
    $('worst-eps').textContent = fmt(worst.epsilon);
    $('worst-rdp').textContent = 'RDP ' + fmt(worst.rdp.epsilon);
    const delta = view ? view.config.delta : null;
    $('worst-detail').textContent =
      'by ' + String(worst.method).toUpperCase() + ', the smaller of two proven bounds' +
      (worst.pld ? '' : ' (PLD not available' + (worst.pld_error ? ': ' + worst.pld_error : '') + ')') +
      '; RDP at order α = ' + fmt(worst.rdp.order) + '; after ' + worst.steps + ' steps' + (delta ? ', δ = ' + fmt(delta) : '');
    // History: each release records the worst case just before it (its bound B,
    // at the release's delta); polling adds the current value at every refresh.
    const dref = delta !== null ? delta : list.releases.length ? list.releases[0].delta : null;
    // The first release of a step holds the worst case right after the step.
    list.releases.slice().sort((a, b) => a.id - b.id).forEach((r) => {
      if (dref === null || r.delta === dref) {
        if (!state.worstHistory.has(r.step)) state.worstHistory.set(r.step, r.bound);
      }
    });
    state.worstHistory.set(worst.steps, worst.epsilon);
    const pts = [...state.worstHistory.entries()].sort((a, b) => a[0] - b[0]);
    const xs = pts.map((p) => p[0]);
    const ys = pts.map((p) => p[1]);
    state.data.worst = { steps: xs, epsilon: ys };
    chart(
      'worst',
      { scales: { x: { time: false } }, axes: [{ label: 'step' }, { label: 'epsilon' }], series: [{ label: 'step' }, lineSeries('worst-case ε (tightest proven)', 0)] },
      [xs, ys],
    );
    $('worst-note').textContent =
      'Points: the worst case just before each DP release (its bound B) and the current value, added at every refresh while this page is open. ' +
      'No endpoint serves the full per-step history.';
  }

  function populationReleases(list) {
    return list.releases.filter((r) => r.values && r.values.population).slice().sort((a, b) => a.id - b.id);
  }

  function renderReleases(list) {
    const rel = populationReleases(list).filter((r) => r.values.population.mean || r.values.population.quantiles);
    const levels = [];
    rel.forEach((r) => (r.values.population.quantiles || []).forEach((q) => levels.includes(q.level) || levels.push(q.level)));
    levels.sort((a, b) => a - b);
    const xs = rel.map((r) => r.step);
    const mean = rel.map((r) => (r.values.population.mean ? r.values.population.mean.mean : null));
    const qs = levels.map((l) => rel.map((r) => {
      const q = (r.values.population.quantiles || []).find((v) => v.level === l);
      return q ? q.value : null;
    }));
    const ids = rel.map((r) => r.id);
    state.data.releases = { ids, steps: xs, mean, levels, quantiles: qs };
    if (!rel.length) {
      if (state.charts.releases) state.charts.releases.destroy();
      delete state.charts.releases;
      fill('chart-releases');
      $('releases-note').textContent = 'No DP release of the mean or quantiles yet.';
      return;
    }
    const series = [{ label: 'step' }, lineSeries('DP mean', 0)];
    levels.forEach((l, i) => series.push(lineSeries('q' + pct(l), i + 1, { width: 1, dash: [4, 3] })));
    const bands = [];
    for (let i = 0; i < Math.floor(levels.length / 2); i++) {
      bands.push({ series: [2 + levels.length - 1 - i, 2 + i], fill: 'rgba(47,111,219,' + (0.08 + 0.06 * i) + ')' });
    }
    chart('releases', { scales: { x: { time: false } }, axes: [{ label: 'step' }, { label: 'epsilon' }], series, bands }, [xs, mean, ...qs]);
    $('releases-note').textContent =
      rel.length + ' releases of the population; shaded: between matching quantile levels. Values are differentially private (noisy).';
  }

  function renderHistogram(list) {
    const r = populationReleases(list).filter((x) => x.values.population.histogram).pop();
    if (!r) {
      state.data.histogram = null;
      fill('chart-histogram');
      $('histogram-note').textContent = 'No DP histogram released yet.';
      return;
    }
    const h = r.values.population.histogram;
    const xs = h.counts.map((_, j) => (h.edges[j] + h.edges[j + 1]) / 2);
    state.data.histogram = { release: r.id, edges: h.edges, counts: h.counts };
    chart(
      'histogram',
      {
        scales: { x: { time: false, range: [h.edges[0], h.edges[h.edges.length - 1]] } },
        axes: [{ label: 'epsilon' }, { label: 'examples (DP count)' }],
        series: [{ label: 'ε bin centre', value: (u, v) => fmt(v) }, { label: 'DP count', fill: 'rgba(47,111,219,.5)', stroke: COLORS[0], paths: bars(), points: { show: false } }],
      },
      [xs, h.counts],
    );
    $('histogram-note').textContent = 'Release #' + r.id + ' at step ' + r.step + ', ' + h.counts.length + ' bins over [0, B = ' + fmt(r.bound) + '].';
  }

  function renderGroups(list) {
    const withGroups = list.releases.filter((r) => r.values && r.values.groups && r.values.groups.length).slice().sort((a, b) => a.id - b.id);
    const host = $('groups');
    if (!withGroups.length) {
      state.data.groups = null;
      host.replaceChildren(el('p', 'No per-group release yet (a curator releases with "by_group": true after setting labels).', 'muted'));
      fill('chart-groups');
      return;
    }
    const latest = withGroups[withGroups.length - 1];
    const name = (g) => (g.label === null || g.label === undefined ? '(unlabelled)' : g.label);
    const levels = [];
    latest.values.groups.forEach((g) => (g.quantiles || []).forEach((q) => levels.includes(q.level) || levels.push(q.level)));
    levels.sort((a, b) => a - b);
    const rows = latest.values.groups.map((g) => [
      name(g),
      g.mean ? fmt(g.mean.mean) : '–',
      g.mean ? fmt(g.mean.count) : '–',
      ...levels.map((l) => {
        const q = (g.quantiles || []).find((v) => v.level === l);
        return q ? fmt(q.value) : '–';
      }),
    ]);
    // Groups with a DP count of 0 (e.g. no unlabelled example) say nothing.
    const means = latest.values.groups.filter((g) => g.mean && g.mean.count > 0).map((g) => g.mean.mean);
    const nodes = [table(['group', 'DP mean ε', 'DP count', ...levels.map((l) => 'q' + pct(l))], rows)];
    if (means.length >= 2) {
      const hi = Math.max(...means);
      const lo = Math.min(...means);
      nodes.push(el('p', 'Disparity between groups (release #' + latest.id + ', step ' + latest.step + '): largest minus smallest DP mean ε = ' +
        fmt(hi - lo) + (lo > 0 ? ', ratio ' + fmt(hi / lo) : '') + '.'));
    }
    host.replaceChildren(...nodes);
    const labels = [];
    withGroups.forEach((r) => r.values.groups.forEach((g) => labels.includes(name(g)) || labels.push(name(g))));
    const xs = withGroups.map((r) => r.step);
    const ys = labels.map((lab) => withGroups.map((r) => {
      const g = r.values.groups.find((x) => name(x) === lab);
      return g && g.mean ? g.mean.mean : null;
    }));
    state.data.groups = { release: latest.id, labels, steps: xs, means: ys };
    chart('groups', { scales: { x: { time: false } }, axes: [{ label: 'step' }, { label: 'DP mean ε' }], series: [{ label: 'step' }, ...labels.map((l, i) => lineSeries(l, i))] }, [xs, ...ys]);
  }

  function renderBudget(list) {
    const b = list.budget;
    $('budget').textContent = b.rho_budget === null ? 'not set' : fmt(b.rho_spent) + ' / ' + fmt(b.rho_budget) + ' ρ';
    const share = b.rho_budget ? Math.min(1, b.rho_spent / b.rho_budget) : 0;
    $('budget-bar').style.width = (share * 100).toFixed(1) + '%';
    $('budget-detail').textContent = b.releases + ' releases, zCDP ρ spent' + (b.rho_budget ? ' (' + (share * 100).toFixed(1) + '%)' : '');
  }

  function renderConfig(view, list) {
    const nodes = [];
    if (view) {
      const c = view.config;
      const s = c.sampling || {};
      const rows = [
        ['examples', String(c.examples)],
        ['max clipping norm C', fmt(c.max_grad_norm)],
        ['rounding r', c.rounding === null || c.rounding === undefined ? 'C/100' : fmt(c.rounding)],
        ['noise multiplier σ', fmt(c.noise_multiplier)],
        ['sampling', s.kind === 'poisson' ? 'Poisson, q = ' + fmt(s.rate) : s.kind + (s.batch_size ? ', batch ' + s.batch_size : '')],
        ['δ', fmt(c.delta)],
        ['clipping', String(c.clipping)],
        ['individual budget', c.individual_budget ? 'ε = ' + fmt(c.individual_budget.epsilon) + ', δ = ' + fmt(c.individual_budget.delta) : 'none'],
        ['steps applied', String(view.status.steps)],
        ['archived', view.archived ? 'yes' : 'no'],
      ];
      nodes.push(table(['hyperparameter', 'value'], rows));
    } else {
      nodes.push(el('p', 'A ' + role() + ' token cannot read the run\'s configuration (GET /v1/datasets/{d} is for admin, curator and trainer); shown: what the releases reveal.', 'muted'));
    }
    const p = list.policy;
    nodes.push(el('p', p && p.every_steps ? 'Release schedule: automatically every ' + p.every_steps + ' steps.' : 'Release schedule: on request only.'));
    if (list.policy_error) nodes.push(el('p', 'The latest policy release was refused: ' + list.policy_error, 'muted'));
    const last = list.releases[0];
    if (last) {
      const q = last.request.quantiles;
      nodes.push(el('p', 'Latest release #' + last.id + ' (' + last.trigger + ') at step ' + last.step + ': ρ = ' + fmt(last.rho) + ', δ = ' + fmt(last.delta) +
        (last.request.mean ? ', mean' : '') + (q ? ', quantiles ' + (q.levels || []).map(pct).join(' ') : '') +
        (last.request.histogram ? ', histogram' : '') + (last.request.by_group ? ', by group' : '') + '.'));
    }
    fill('config', ...nodes);
  }

  function whereAmongQuantiles(eps, list) {
    const r = populationReleases(list).filter((x) => x.values.population.quantiles && x.values.population.quantiles.length).pop();
    if (!r) return null;
    const qs = r.values.population.quantiles;
    let text;
    if (eps < qs[0].value) text = 'below the released ' + pct(qs[0].level) + ' quantile (' + fmt(qs[0].value) + ')';
    else if (eps >= qs[qs.length - 1].value) text = 'at or above the released ' + pct(qs[qs.length - 1].level) + ' quantile (' + fmt(qs[qs.length - 1].value) + ')';
    else {
      let k = 0;
      while (k + 1 < qs.length && eps >= qs[k + 1].value) k++;
      text = 'between the released ' + pct(qs[k].level) + ' (' + fmt(qs[k].value) + ') and ' + pct(qs[k + 1].level) + ' (' + fmt(qs[k + 1].value) + ') quantiles';
    }
    return { release: r.id, text };
  }

  // The per-example value releases and the exact distribution use: the
  // ex-post bound with predictable thresholds, the estimate otherwise.
  function perExample(p) {
    return p.example.ex_post ? p.example.ex_post.epsilon : p.example.estimate.epsilon;
  }

  function renderOwner(mine, list) {
    show('owner', true);
    const rows = mine.map((p) => {
      const pos = whereAmongQuantiles(perExample(p), list);
      return ['example ' + p.example.id, fmt(p.example.epsilon) + (p.example.guarantee.kind === 'individual_filter' ? ' (individual budget)' : ''),
        p.example.ex_post ? fmt(p.example.ex_post.epsilon) : 'n/a (thresholds not predictable)', fmt(p.example.estimate.epsilon), fmt(p.worst_case.epsilon),
        pos ? pos.text + ' (release #' + pos.release + ')' : 'no DP quantiles released yet', p.example.retired ? 'retired' : 'training'];
    });
    state.data.owner = mine.map((p) => ({ id: p.example.id, epsilon: p.example.epsilon, ex_post: p.example.ex_post ? p.example.ex_post.epsilon : null, estimate: p.example.estimate.epsilon, worst: p.worst_case.epsilon }));
    fill('owner-rows', table(['example', 'guaranteed ε', 'ex-post ε (this run)', 'estimate', 'worst-case ε', 'among all examples', 'state'], rows));
    const p = mine[0];
    if (!p) {
      $('owner-explain').textContent = '';
      return;
    }
    const d = fmt(p.delta);
    let text = 'Guaranteed for every example: ε = ' + fmt(p.example.epsilon) + ' at δ = ' + d +
      (p.example.guarantee.kind === 'individual_filter'
        ? ' (the run kept your example within its individual budget, so this holds for it before any training happened).'
        : ' (what DP-SGD promises every example: the odds of any conclusion about your example change by at most a factor e^ε ≈ ' + fmt(Math.exp(p.example.epsilon)) + ', except with probability δ).');
    if (p.example.ex_post) {
      text += ' In this run, your example: at most ' + fmt(p.example.ex_post.epsilon) + ' with probability 1 − ' + d +
        ' — what was actually released reveals at most that much about it (a statement about this run, not a promise made in advance).';
    } else {
      text += ' No per-run bound exists for this dataset: its thresholds were not predictable, so per-example numbers are estimates only.';
    }
    text += ' Estimate: ' + fmt(p.example.estimate.epsilon) + ' (not a guarantee). The quantiles it is compared with are differentially private estimates over all examples, so its position is approximate.';
    $('owner-explain').textContent = text;
  }

  async function renderCurator(view, worst) {
    const n = view.status.examples;
    show('curator', true);
    if (n > 20000) {
      fill('exact-summary', el('p', 'The exact distribution is fetched one example at a time; this page does it up to 20,000 examples (this run has ' + n + ').', 'muted'));
      return;
    }
    const ids = Array.from({ length: n }, (_, i) => i);
    const [privs, thr] = await Promise.all([
      pool(ids, 16, (i) => api(base() + '/examples/' + i + '/privacy')),
      api(base() + '/thresholds?start=0&end=' + n),
    ]);
    const eps = privs.map((p) => perExample(p));
    const sorted = eps.slice().sort((a, b) => a - b);
    const at = (q) => sorted[Math.min(n - 1, Math.floor(q * (n - 1)))];
    const w = worst.epsilon;
    const atWorst = privs.filter((p) => perExample(p) >= w * (1 - 1e-9)).map((p) => p.example.id);
    state.data.exact = { epsilons: eps, atWorst, retired: thr.retired };
    fill('exact-summary', table(['examples', 'min', '25%', 'median', '75%', 'max', 'mean', 'worst case'], [[
      String(n), fmt(sorted[0]), fmt(at(0.25)), fmt(at(0.5)), fmt(at(0.75)), fmt(sorted[n - 1]), fmt(eps.reduce((a, b) => a + b, 0) / n), fmt(w)]]));
    const bins = 20;
    const hi = Math.max(w, sorted[n - 1]) || 1;
    const counts = new Array(bins).fill(0);
    eps.forEach((e) => counts[Math.min(bins - 1, Math.floor((e / hi) * bins))]++);
    const xs = counts.map((_, j) => ((j + 0.5) * hi) / bins);
    state.data.exact.counts = counts;
    chart('exact', {
      scales: { x: { time: false, range: [0, hi] } },
      axes: [{ label: 'epsilon' }, { label: 'examples (exact)' }],
      series: [{ label: 'ε bin centre', value: (u, v) => fmt(v) }, { label: 'examples', fill: 'rgba(217,72,15,.5)', stroke: COLORS[1], paths: bars(), points: { show: false } }],
    }, [xs, counts]);
    const list = (ids2) => el('p', ids2.length ? ids2.length + ': ' + ids2.slice(0, 500).join(', ') + (ids2.length > 500 ? ', …' : '') : 'none', 'idlist');
    fill('at-worst', list(atWorst));
    fill('retired', list(thr.retired));
  }

  // ---- loading ------------------------------------------------------------
  async function load() {
    const needView = readsStatus();
    const [worst, list, view] = await Promise.all([
      api(base() + '/worst-case'),
      api(base() + '/releases?limit=1000'),
      needView ? api(base()) : Promise.resolve(null),
    ]);
    const latest = list.releases.length ? list.releases[0].id : 0;
    const sig = [worst.steps, latest, list.budget.rho_spent, list.budget.rho_budget].join('/');
    state.data.api = { worst, releases: list.releases.length, budget: list.budget };
    $('refreshed').textContent = 'refreshed ' + new Date().toLocaleTimeString() + ' · every ' + state.refreshMs / 1000 + ' s';
    if (sig === state.signature) return;
    state.signature = sig;
    let mine = null;
    if (role() === 'owner') {
      mine = await Promise.all((state.claims.examples || []).map((i) => api(base() + '/examples/' + i + '/privacy')));
    }
    show('dash', true);
    renderWorst(worst, view, list);
    renderBudget(list);
    renderReleases(list);
    renderHistogram(list);
    renderGroups(list);
    renderConfig(view, list);
    if (mine) renderOwner(mine, list);
    state.renders++;
    if (state.firstRenderMs === null) state.firstRenderMs = performance.now();
    if (curates() && view) {
      await renderCurator(view, worst);
      if (state.exactRenderMs === null) state.exactRenderMs = performance.now();
    }
    document.body.dataset.state = 'ready';
  }

  function explain(e) {
    if (e instanceof ApiError) {
      if (e.status === 401) return 'The server refused this token (401): ' + e.message + '. Paste a valid, unexpired token.';
      if (e.status === 403) return 'This token is not allowed to read this (403): ' + e.message + '.';
      if (e.status === 404) return 'Not found (404): ' + e.message + '.';
      return 'The server answered ' + e.status + ': ' + e.message + '.';
    }
    return 'Could not reach the server: ' + e.message;
  }

  async function refresh() {
    if (document.hidden) return;
    try {
      await load();
      message('');
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) showLogin(explain(e));
      else message(explain(e));
    }
  }

  function stopRefresh() {
    if (state.timer) clearInterval(state.timer);
    state.timer = null;
  }

  async function start(t) {
    t = t.trim();
    let claims;
    try {
      claims = decodeClaims(t);
    } catch (e) {
      showLogin(e.message);
      return;
    }
    if (typeof claims.exp === 'number' && claims.exp * 1000 <= Date.now()) {
      showLogin('This token expired at ' + new Date(claims.exp * 1000).toISOString() + '. Paste a new one (dpledger token --role …).');
      return;
    }
    token = t;
    sessionStorage.setItem(KEY, t);
    state.claims = claims;
    show('login', false);
    message('');
    renderWho();
    try {
      if (claims.role === 'admin') {
        const ds = (await api('/v1/datasets')).datasets;
        const sel = $('dataset-select');
        sel.replaceChildren(...ds.map((d) => { const o = el('option', d); o.value = d; return o; }));
        show('dataset-picker', ds.length > 1);
        const wanted = params.get('dataset');
        state.dataset = ds.includes(wanted) ? wanted : ds[0];
        if (!state.dataset) {
          message('There is no dataset yet: create one with POST /v1/datasets.');
          return;
        }
        sel.value = state.dataset;
      } else {
        state.dataset = claims.dataset;
      }
      await load();
      stopRefresh();
      state.timer = setInterval(refresh, state.refreshMs);
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) showLogin(explain(e));
      else message(explain(e));
    }
  }

  function init() {
    $('token-submit').addEventListener('click', () => start($('token-input').value));
    $('forget').addEventListener('click', () => showLogin(''));
    $('dataset-select').addEventListener('change', (ev) => {
      state.dataset = ev.target.value;
      state.signature = null;
      state.worstHistory = new Map();
      show('curator', false);
      refresh();
    });
    const saved = sessionStorage.getItem(KEY);
    if (saved) start(saved);
    else showLogin('');
  }

  init();
})();
