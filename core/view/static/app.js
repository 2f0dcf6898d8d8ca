// tracerl run viewer: overview -> step -> trajectory, and eval compare.
// No framework, no network beyond this page's own api/ (none at all in a static export).
// Agent text is untrusted: every node is built with DOM calls and text nodes, never innerHTML.
(function () {
  'use strict';
  const SVGNS = 'http://www.w3.org/2000/svg';
  const EMBED = document.getElementById('tracerl-data');
  const STATIC = EMBED ? JSON.parse(EMBED.textContent) : null;
  const root = document.getElementById('app');
  const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#d97706', '#7c3aed', '#0891b2', '#db2777', '#65a30d', '#475569'];
  const STATUS_COLORS = {
    timeout: '#d97706', crashed: '#dc2626', no_reward: '#7c3aed', invalid_reward: '#db2777',
    rejected: '#475569', sampler_error: '#0891b2', no_model_calls: '#65a30d',
    judge_error: '#9333ea', reward_timeout: '#ca8a04', reward_pending: '#64748b',
  };
  // Tool-call parse statuses of a turn (core.types.ParseStatus), in their documented order.
  const PARSE_ORDER = ['no_tools', 'text', 'calls', 'unknown_tool', 'bad_json', 'schema_mismatch', 'markup_no_call'];
  const PARSE_FAILED = new Set(['unknown_tool', 'bad_json', 'schema_mismatch', 'markup_no_call']);
  let RUN = null;
  let pollTimer = null;
  let explorerKey = '';
  const stepState = { status: 'all', parse: 'all', policy: 'all', min: '', max: '', sort: 'prompt', grouped: true };
  // The policy of a run that configures none (core.types.DEFAULT_POLICY): not shown alone.
  const DEFAULT_POLICY = 'default';

  // ---------------------------------------------------------------- helpers
  function h(tag, attrs, ...kids) {
    const svg = tag.startsWith('svg:');
    const el = svg ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else if (k === 'style') Object.assign(el.style, v);
      else el.setAttribute(k, String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.appendChild(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  const isNum = (x) => typeof x === 'number' && isFinite(x);
  const fmt = (x, d = 3) => (isNum(x) ? x.toFixed(d) : '–');
  const fmtInt = (x) => (isNum(x) ? Math.round(x).toLocaleString('en-US') : '–');
  const short = (s, n) => (s.length > n ? s.slice(0, n - 1) + '…' : s);
  const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN);
  function badge(status) {
    return h('span', { class: 'badge ' + (status === 'ok' ? 'ok' : 'bad'), 'data-status': status }, status);
  }
  function parseBadge(status, detail, label) {
    return h('span', { class: 'badge parse ' + (PARSE_FAILED.has(status) ? 'bad' : 'info'), 'data-parse': status, title: detail || null }, label || status);
  }
  function hasParse(r, want) {
    const seen = r.parse || {};
    if (want === 'all') return true;
    if (want === 'failed') return Object.keys(seen).some((s) => PARSE_FAILED.has(s));
    return (seen[want] || 0) > 0;
  }
  function policyBadge(name, label) {
    return h('span', { class: 'badge policy', 'data-policy': name }, label || 'policy: ' + name);
  }
  function hasPolicy(r, want) {
    return want === 'all' || ((r.policies || {})[want] || 0) > 0;
  }
  function heat(p) {
    const hue = Math.round(120 * Math.max(0, Math.min(1, p)));
    return `hsl(${hue}, 72%, 80%)`;
  }
  function jsonText(x) {
    if (typeof x === 'string') return x;
    try { return JSON.stringify(x); } catch (e) { return String(x); }
  }
  function link(hash, ...kids) { return h('a', { href: '#' + hash }, ...kids); }
  const enc = encodeURIComponent;

  async function getJSON(url) {
    const r = await fetch(url, { cache: 'no-store' });
    let body = null;
    try { body = await r.json(); } catch (e) { body = { error: r.statusText }; }
    if (!r.ok) throw new Error(body && body.error ? body.error : r.statusText);
    return body;
  }
  function fromStatic(value, missing) {
    return value === undefined ? Promise.reject(new Error(missing)) : Promise.resolve(value);
  }
  const api = {
    run: () => (STATIC ? Promise.resolve(STATIC.run) : getJSON('api/run')),
    step: (kind, n) => (STATIC
      ? fromStatic(STATIC.steps[kind + '/' + n], `${kind} step ${n} is not in this file (python -m core.view RUN_DIR --static OUT.html --steps all embeds every step)`)
      : getJSON(`api/step?kind=${enc(kind)}&step=${enc(n)}`)),
    rollout: (kind, n, id) => (STATIC
      ? fromStatic(STATIC.rollouts[kind + '/' + n + '/' + id], `rollout ${id} of ${kind} step ${n} is not in this file`)
      : getJSON(`api/rollout?kind=${enc(kind)}&step=${enc(n)}&id=${enc(id)}`)),
  };

  // ---------------------------------------------------------------- layout
  function frame(view, crumbs, ...content) {
    const live = STATIC
      ? h('span', { class: 'live stale' }, 'static export')
      : h('span', { class: 'live', id: 'live' }, RUN && !RUN.finished ? 'live · refreshing' : 'live');
    const nav = h('nav', {}, link('/', 'Overview'));
    if (RUN && RUN.traces.eval.length) nav.appendChild(link('/compare', 'Compare evals'));
    for (const c of crumbs) nav.append(h('span', { class: 'sep' }, '›'), c);
    const top = h('header', { class: 'top' }, h('span', { class: 'brand' }, 'tracerl'), h('span', { class: 'muted' }, RUN ? RUN.name : ''), nav, live);
    const main = h('main', { id: 'view', 'data-view': view }, ...content);
    root.replaceChildren(top, main, h('div', { class: 'hover', id: 'hover' }));
    return main;
  }

  // ---------------------------------------------------------------- charts
  function chart(title, series, opts = {}) {
    const W = 560, H = 210, L = 48, R = 10, T = 10, B = 24;
    const pw = W - L - R, ph = H - T - B;
    const xs = [...new Set(series.flatMap((s) => s.pts.map((p) => p[0])))].sort((a, b) => a - b);
    const box = h('div', { class: opts.bare ? 'chart' : 'panel chart', 'data-chart': title }, h('h3', {}, title));
    if (!xs.length) { box.appendChild(h('p', { class: 'muted' }, opts.empty || 'no data yet')); return box; }
    const x0 = xs[0], x1 = xs[xs.length - 1] === x0 ? x0 + 1 : xs[xs.length - 1];
    let y0 = 0, y1 = 0;
    if (opts.stacked) {
      for (const x of xs) {
        let sum = 0;
        for (const s of series) { const p = s.pts.find((q) => q[0] === x); if (p && isNum(p[1])) sum += Math.max(0, p[1]); }
        y1 = Math.max(y1, sum);
      }
    } else {
      const ys = series.flatMap((s) => s.pts.map((p) => p[1])).filter(isNum);
      y0 = Math.min(0, ...ys); y1 = Math.max(...ys, 0);
      if (y0 >= 0 && y1 <= 1 && opts.unit) y1 = 1;
    }
    if (y1 === y0) y1 = y0 + 1;
    const slot = new Map(xs.map((x, i) => [x, i]));
    const sx = opts.stacked
      ? (x) => L + ((slot.has(x) ? slot.get(x) : 0) + 0.5) * (pw / xs.length)
      : (x) => L + ((x - x0) / (x1 - x0)) * pw;
    const sy = (y) => T + ph - ((y - y0) / (y1 - y0)) * ph;
    const svg = h('svg:svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title });
    for (const g of [0, 0.5, 1]) {
      const v = y0 + g * (y1 - y0);
      svg.append(
        h('svg:line', { x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: '#e5e7eb' }),
        h('svg:text', { x: L - 4, y: sy(v) + 4, 'font-size': 10, 'text-anchor': 'end', fill: '#6b7280' }, opts.fmt ? opts.fmt(v) : (Math.abs(v) >= 100 ? v.toFixed(0) : +v.toPrecision(3))),
      );
    }
    for (const x of [x0, xs[Math.floor(xs.length / 2)], xs[xs.length - 1]]) {
      svg.appendChild(h('svg:text', { x: sx(x), y: H - 6, 'font-size': 10, 'text-anchor': 'middle', fill: '#6b7280' }, x));
    }
    if (opts.stacked) {
      const bw = Math.max(1, (pw / xs.length) * 0.8);
      for (const x of xs) {
        let base = 0;
        for (const s of series) {
          const p = s.pts.find((q) => q[0] === x);
          if (!p || !isNum(p[1]) || p[1] <= 0) continue;
          svg.appendChild(h('svg:rect', { x: sx(x) - bw / 2, y: sy(base + p[1]), width: bw, height: Math.max(0.5, sy(base) - sy(base + p[1])), fill: s.color }));
          base += p[1];
        }
      }
    } else {
      for (const s of series) {
        const pts = s.pts.filter((p) => isNum(p[1]));
        if (pts.length > 1) svg.appendChild(h('svg:polyline', { fill: 'none', stroke: s.color, 'stroke-width': 1.8, points: pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(' ') }));
        if (pts.length <= 60 || s.dots) for (const p of pts) svg.appendChild(h('svg:circle', { cx: sx(p[0]), cy: sy(p[1]), r: s.dots ? 3 : 1.8, fill: s.color }));
      }
    }
    const cursor = h('svg:line', { x1: 0, x2: 0, y1: T, y2: T + ph, stroke: '#94a3b8', visibility: 'hidden' });
    svg.appendChild(cursor);
    const tip = h('div', { class: 'tip' }, opts.pick ? 'hover for values · click a step to open it' : 'hover for values');
    const overlay = h('svg:rect', { x: L, y: T, width: pw, height: ph, fill: 'transparent', style: { cursor: opts.pick ? 'pointer' : 'default' } });
    const nearest = (evt) => {
      const r = svg.getBoundingClientRect();
      const px = ((evt.clientX - r.left) / r.width) * W;
      let best = xs[0];
      for (const x of xs) if (Math.abs(sx(x) - px) < Math.abs(sx(best) - px)) best = x;
      return best;
    };
    overlay.addEventListener('mousemove', (evt) => {
      const x = nearest(evt);
      cursor.setAttribute('x1', sx(x)); cursor.setAttribute('x2', sx(x)); cursor.setAttribute('visibility', 'visible');
      const parts = series.map((s) => { const p = s.pts.find((q) => q[0] === x); return p ? `${s.name} ${opts.fmt ? opts.fmt(p[1]) : fmt(p[1], 3)}` : null; }).filter(Boolean);
      tip.textContent = `step ${x}: ${parts.join(' · ')}`;
    });
    overlay.addEventListener('mouseleave', () => cursor.setAttribute('visibility', 'hidden'));
    if (opts.pick) overlay.addEventListener('click', (evt) => opts.pick(nearest(evt)));
    svg.appendChild(overlay);
    box.append(svg, h('div', { class: 'legend' }, series.map((s) => h('span', {}, h('i', { style: { background: s.color } }), s.name))), tip);
    return box;
  }
  const seriesOf = (steps, key) => steps.filter((r) => key in r).map((r) => [r.step, r[key]]);

  // ---------------------------------------------------------------- overview
  async function viewOverview() {
    RUN = await api.run();
    const run = RUN;
    const steps = run.steps;
    const stored = new Set(run.traces.train);
    const pick = (x) => { if (stored.has(x)) location.hash = `#/step/train/${x}`; };
    const last = steps[steps.length - 1];
    const rewards = steps.map((r) => r['reward/mean']).filter(isNum);
    const evals = run.evals.filter((e) => isNum(e.reward));
    const failed = Object.entries(run.statuses).filter(([s]) => s !== 'ok').reduce((a, [, n]) => a + n, 0);
    const card = (label, value, id) => h('div', { class: 'card', id }, h('div', { class: 'label' }, label), h('div', { class: 'value' }, value));
    const cards = h('div', { class: 'cards' },
      card('steps', last ? String(last.step) : '0', 'card-steps'),
      card('reward, last step', fmt(last ? last['reward/mean'] : NaN), 'card-reward'),
      card('reward, mean of last 5', fmt(mean(rewards.slice(-5))), 'card-reward5'),
      card('eval reward, last', evals.length ? fmt(evals[evals.length - 1].reward) : '–', 'card-eval'),
      card('failed rollouts', fmtInt(failed), 'card-failed'),
      card('steps with traces', `${run.traces.train.length} (+${run.traces.eval.length} evals)`, 'card-traces'),
    );
    const failedStatuses = Object.keys(run.statuses).filter((s) => s !== 'ok');
    const timeKeys = [['time/rollout', 'rollout'], ['time/train', 'train'], ['time/weight_sync', 'weight sync'], ['time/eval', 'eval'], ['time/checkpoint', 'checkpoint']];
    const timeSeries = timeKeys.map(([k, name], i) => ({ name, color: COLORS[i], pts: seriesOf(steps, k) }));
    timeSeries.push({ name: 'other', color: '#9ca3af', pts: steps.filter((r) => isNum(r['time/step'])).map((r) => [r.step, Math.max(0, r['time/step'] - timeKeys.reduce((a, [k]) => a + (isNum(r[k]) ? r[k] : 0), 0))]) });
    const numericKeys = [...new Set(steps.flatMap((r) => Object.keys(r)))].filter((k) => k !== 'step').sort();
    const staleKeys = numericKeys.filter((k) => /stale/i.test(k));
    const grid = h('div', { class: 'grid' },
      chart('Reward', [
        { name: 'train reward (mean)', color: COLORS[0], pts: seriesOf(steps, 'reward/mean') },
        { name: 'eval reward', color: COLORS[1], pts: run.evals.map((e) => [e.step, e.reward]), dots: true },
      ], { unit: true, pick }),
      chart('Failed rollouts by status', failedStatuses.filter((s) => run.statuses[s] > 0).map((s) => ({ name: s, color: STATUS_COLORS[s] || '#9ca3af', pts: seriesOf(steps, 'rollouts/' + s) })), { stacked: true, pick, fmt: (v) => String(Math.round(v)), empty: 'no failed rollouts' }),
      chart('Step time (s)', timeSeries, { stacked: true, pick, fmt: (v) => v.toFixed(2) }),
      chart('Tokens per step', [
        { name: 'all tokens', color: COLORS[0], pts: seriesOf(steps, 'tokens/total') },
        { name: 'trained tokens', color: COLORS[2], pts: seriesOf(steps, 'tokens/trained') },
      ], { pick, fmt: (v) => fmtInt(v) }),
    );
    const withTools = steps.filter((r) => r['gateway/turns_with_tools'] > 0);
    if (withTools.length) grid.appendChild(chart('Tool calls that failed to parse', [{ name: 'failed share of turns with tools offered', color: COLORS[1], pts: withTools.map((r) => [r.step, r['gateway/tool_parse_failed']]) }], { unit: true, pick, fmt: (v) => (100 * v).toFixed(0) + '%' }));
    if (staleKeys.length) grid.appendChild(chart('Staleness', staleKeys.map((k, i) => ({ name: k, color: COLORS[i % COLORS.length], pts: seriesOf(steps, k) })), { pick }));
    // The metrics the agents returned with their rewards, mean per step (agent/<name> in metrics.jsonl).
    const agentKeys = numericKeys.filter((k) => k.startsWith('agent/'));
    if (agentKeys.length) grid.appendChild(chart('Agent metrics (mean per step)', agentKeys.map((k, i) => ({ name: k.slice('agent/'.length), color: COLORS[i % COLORS.length], pts: seriesOf(steps, k) })), { pick }));
    const explorer = h('div', { class: 'panel' });
    const sel = h('select', { id: 'metric-select' }, numericKeys.map((k) => h('option', { value: k }, k)));
    const drawExplorer = () => explorer.replaceChildren(h('div', { class: 'controls' }, h('label', {}, 'any metric: '), sel), chart(sel.value || 'metric', [{ name: sel.value, color: COLORS[4], pts: seriesOf(steps, sel.value) }], { pick, bare: true }));
    sel.value = numericKeys.includes(explorerKey) ? explorerKey : numericKeys.includes('train/logprob_diff_max') ? 'train/logprob_diff_max' : numericKeys[0] || '';
    sel.addEventListener('change', () => { explorerKey = sel.value; drawExplorer(); });
    drawExplorer();
    grid.appendChild(explorer);

    const total = Object.values(run.statuses).reduce((a, b) => a + b, 0);
    const statusTable = h('table', { id: 'status-counts' },
      h('thead', {}, h('tr', {}, h('th', {}, 'status'), h('th', { class: 'num' }, 'rollouts'), h('th', { class: 'num' }, 'share'))),
      h('tbody', {}, Object.entries(run.statuses).map(([s, n]) => h('tr', { 'data-status': s }, h('td', {}, badge(s)), h('td', { class: 'num count' }, fmtInt(n)), h('td', { class: 'num' }, total ? (100 * n / total).toFixed(1) + '%' : '–')))));

    const evalAt = new Map(run.evals.map((e) => [e.step, e.reward]));
    const rows = steps.slice().reverse().map((r) => {
      const fails = failedStatuses.filter((s) => r['rollouts/' + s] > 0).map((s) => `${s} ${r['rollouts/' + s]}`).join(', ');
      const has = stored.has(r.step);
      return h('tr', { 'data-step': r.step, class: has ? 'click' : null, onclick: has ? () => { location.hash = `#/step/train/${r.step}`; } : null },
        h('td', { class: 'num' }, has ? link(`/step/train/${r.step}`, String(r.step)) : String(r.step)),
        h('td', { class: 'num reward' }, fmt(r['reward/mean'])),
        h('td', { class: 'num' }, fmt(r['reward/std'])),
        h('td', { class: 'num' }, evalAt.has(r.step) ? (run.traces.eval.includes(r.step) ? link(`/step/eval/${r.step}`, fmt(evalAt.get(r.step))) : fmt(evalAt.get(r.step))) : ''),
        h('td', { class: 'num ok' }, fmtInt(r['rollouts/ok'])),
        h('td', { class: 'num failed' }, fmtInt(r['rollouts/failed'])),
        h('td', {}, fails),
        h('td', { class: 'num' }, `${fmtInt(r['tokens/trained'])} / ${fmtInt(r['tokens/total'])}`),
        h('td', { class: 'num' }, fmt(r['time/step'], 2)),
      );
    });
    const stepsTable = h('table', { id: 'steps-table' },
      h('thead', {}, h('tr', {}, ['step', 'reward', 'std', 'eval', 'ok', 'failed', 'failures', 'tokens trained / all', 'seconds'].map((c, i) => h('th', { class: i === 6 ? '' : 'num' }, c)))),
      h('tbody', {}, rows));
    const scrollY = window.scrollY;
    frame('overview', [],
      h('h1', {}, 'Run ', run.name),
      h('p', { class: 'muted mono' }, run.run_dir, run.finished ? ' · finished' : ' · training or interrupted'),
      cards, grid,
      h('h2', {}, 'Rollouts by status (all steps)'), h('div', { class: 'panel' }, statusTable),
      run.traces.eval.length ? h('p', { id: 'eval-links' }, 'Evaluations: ', run.traces.eval.map((n, i) => [i ? ' · ' : '', link(`/step/eval/${n}`, `step ${n}`), evalAt.has(n) ? ` (${fmt(evalAt.get(n))})` : '']), ' — ', link('/compare', 'compare an eval prompt between checkpoints →')) : null,
      h('h2', {}, 'Steps'),
      run.traces.train.length ? null : h('p', { class: 'note' }, 'No traces stored for this run (trainer.save_traces=0, or a run older than the viewer): the per-step views need them.'),
      stepsTable);
    window.scrollTo(0, scrollY);
  }

  // ---------------------------------------------------------------- step
  async function viewStep(kind, n) {
    if (!RUN) RUN = await api.run();
    let data;
    try {
      data = await api.step(kind, n);
    } catch (err) {
      // Removed since the page last read the run (trainer.keep_traces keeps only the newest
      // training steps), or never stored: say so and link the stored steps on either side.
      if (!STATIC) RUN = await api.run();
      const stored = RUN.traces[kind] || [];
      if (stored.includes(n)) throw err;
      const before = stored.filter((x) => x < n).pop();
      const after = stored.find((x) => x > n);
      frame('missing', [h('span', {}, `${kind} step ${n}`)], h('h1', {}, `No ${kind} traces for step ${n}`),
        h('p', { class: 'note', id: 'missing' }, String(err && err.message ? err.message : err)),
        h('p', {}, before !== undefined ? link(`/step/${kind}/${before}`, `← ${kind} step ${before}`) : null, ' ',
          after !== undefined ? link(`/step/${kind}/${after}`, `${kind} step ${after} →`) : null, ' ', link('/', 'overview')));
      return;
    }
    const list = RUN.traces[kind] || [];
    const at = list.indexOf(n);
    const navLinks = h('p', {},
      at > 0 ? link(`/step/${kind}/${list[at - 1]}`, `← ${kind} step ${list[at - 1]}`) : null, ' ',
      at >= 0 && at < list.length - 1 ? link(`/step/${kind}/${list[at + 1]}`, `${kind} step ${list[at + 1]} →`) : null);
    const record = kind === 'train' ? RUN.steps.find((r) => r.step === n) : null;
    const statuses = [...new Set(data.rollouts.map((r) => r.status))].sort();
    const counts = {};
    for (const r of data.rollouts) counts[r.status] = (counts[r.status] || 0) + 1;
    const listBox = h('div', { id: 'rollouts' });
    const statusSel = h('select', { id: 'filter-status' }, h('option', { value: 'all' }, 'all statuses'), statuses.map((s) => h('option', { value: s }, `${s} (${counts[s]})`)));
    const minIn = h('input', { type: 'number', step: 'any', id: 'filter-min', placeholder: 'min' });
    const maxIn = h('input', { type: 'number', step: 'any', id: 'filter-max', placeholder: 'max' });
    const sortSel = h('select', { id: 'sort' }, [['prompt', 'prompt order'], ['reward-desc', 'reward ↓'], ['reward-asc', 'reward ↑'], ['adv-desc', 'advantage ↓'], ['adv-asc', 'advantage ↑'], ['time-desc', 'duration ↓'], ['status', 'status']].map(([v, t]) => h('option', { value: v }, t)));
    const groupBox = h('input', { type: 'checkbox', id: 'group-toggle' });
    statusSel.value = statuses.includes(stepState.status) ? stepState.status : 'all';
    // Filter by the parse status of any of a rollout's turns (traces written before parse
    // statuses have none: the control is left out).
    const parseSeen = PARSE_ORDER.filter((s) => data.rollouts.some((r) => hasParse(r, s)));
    const parseCount = (want) => data.rollouts.filter((r) => hasParse(r, want)).length;
    const parseSel = h('select', { id: 'filter-parse' }, h('option', { value: 'all' }, 'all tool-call parses'),
      parseSeen.some((s) => PARSE_FAILED.has(s)) ? h('option', { value: 'failed' }, `any failed (${parseCount('failed')})`) : null,
      parseSeen.map((s) => h('option', { value: s }, `${s} (${parseCount(s)})`)));
    parseSel.value = parseSeen.includes(stepState.parse) || (stepState.parse === 'failed' && parseSeen.some((s) => PARSE_FAILED.has(s))) ? stepState.parse : 'all';
    // Filter by the policy that generated any of a rollout's turns (#34), shown when the step
    // has a policy other than the default one.
    const policySeen = [...new Set(data.rollouts.flatMap((r) => Object.keys(r.policies || {})))].sort();
    const showPolicies = policySeen.some((p) => p !== DEFAULT_POLICY);
    const policySel = h('select', { id: 'filter-policy' }, h('option', { value: 'all' }, 'all policies'),
      policySeen.map((p) => h('option', { value: p }, `${p} (${data.rollouts.filter((r) => hasPolicy(r, p)).length})`)));
    policySel.value = policySeen.includes(stepState.policy) ? stepState.policy : 'all';
    minIn.value = stepState.min; maxIn.value = stepState.max; sortSel.value = stepState.sort; groupBox.checked = stepState.grouped;
    const num = (x, dflt) => (isNum(x) ? x : dflt);
    const sorters = {
      prompt: () => 0,
      'reward-desc': (a, b) => num(b.reward, -Infinity) - num(a.reward, -Infinity),
      'reward-asc': (a, b) => num(a.reward, Infinity) - num(b.reward, Infinity),
      'adv-desc': (a, b) => num(b.advantage, -Infinity) - num(a.advantage, -Infinity),
      'adv-asc': (a, b) => num(a.advantage, Infinity) - num(b.advantage, Infinity),
      'time-desc': (a, b) => num(b.elapsed_s, 0) - num(a.elapsed_s, 0),
      status: (a, b) => a.status.localeCompare(b.status),
    };
    const rowOf = (r, i) => h('tr', { class: 'click', 'data-rollout': r.rollout_id, 'data-status': r.status, onclick: () => { location.hash = `#/rollout/${kind}/${n}/${enc(r.rollout_id)}`; } },
      h('td', { class: 'num' }, String(i + 1)),
      h('td', {}, badge(r.status)),
      h('td', { class: 'num reward' }, fmt(r.reward)),
      h('td', { class: 'num' }, fmt(r.advantage)),
      h('td', { class: 'num' }, String(r.turns)),
      h('td', { class: 'parse' }, PARSE_ORDER.filter((s) => hasParse(r, s)).map((s) => [parseBadge(s, null, `${s} ${r.parse[s]}`), ' '])),
      showPolicies ? h('td', { class: 'policy' }, Object.entries(r.policies || {}).map(([p, c]) => [policyBadge(p, `${p} ${c}`), ' '])) : null,
      h('td', { class: 'num' }, String(r.rows)),
      h('td', { class: 'num' }, `${fmtInt(r.trained)} / ${fmtInt(r.tokens)}`),
      h('td', { class: 'num weights' }, r.weight_versions.map((v) => 'v' + v).join(' '),
        r.interrupted_turns ? h('span', { class: 'badge segmented', title: 'turns a weight update interrupted (continued under the new weights)' }, `${r.interrupted_turns} interrupted`) : null,
        isNum(data.weight_version) && r.weight_versions.length && data.weight_version > r.weight_versions[0]
          ? h('span', { class: 'muted', title: `sampled with weights up to ${data.weight_version - r.weight_versions[0]} versions older than the step trained (v${data.weight_version})` }, ` −${data.weight_version - r.weight_versions[0]}`) : null),
      h('td', { class: 'num' }, fmt(r.elapsed_s, 2) + ' s'),
      h('td', { class: 'mono' }, r.truncated ? h('span', { class: 'badge info' }, 'truncated') : null, ' ', short(r.error || '', 140)));
    const columns = ['#', 'status', 'reward', 'advantage', 'turns', 'tool-call parses', showPolicies ? 'policies (turns)' : null, 'rows', 'tokens trained / all', 'weights', 'duration', 'notes, error'].filter((c) => c !== null);
    const textColumns = new Set(['status', 'tool-call parses', 'policies (turns)', 'notes, error']);
    const head = () => h('thead', {}, h('tr', {}, columns.map((c) => h('th', { class: textColumns.has(c) ? '' : 'num' }, c))));
    const draw = () => {
      Object.assign(stepState, { status: statusSel.value, parse: parseSel.value, policy: policySel.value, min: minIn.value, max: maxIn.value, sort: sortSel.value, grouped: groupBox.checked });
      const lo = minIn.value === '' ? -Infinity : Number(minIn.value);
      const hi = maxIn.value === '' ? Infinity : Number(maxIn.value);
      const index = new Map(data.rollouts.map((r, i) => [r.rollout_id, i]));
      const keep = data.rollouts.filter((r) => (statusSel.value === 'all' || r.status === statusSel.value)
        && hasParse(r, parseSel.value)
        && hasPolicy(r, policySel.value)
        && ((minIn.value === '' && maxIn.value === '') || (isNum(r.reward) && r.reward >= lo && r.reward <= hi)));
      const sorted = keep.slice().sort((a, b) => sorters[sortSel.value](a, b) || index.get(a.rollout_id) - index.get(b.rollout_id));
      const shown = h('p', { class: 'muted', id: 'shown' }, `${keep.length} of ${data.rollouts.length} rollouts`);
      if (!groupBox.checked) {
        listBox.replaceChildren(shown, h('table', { class: 'rtable' }, head(), h('tbody', {}, sorted.map((r) => rowOf(r, index.get(r.rollout_id))))));
        return;
      }
      const groups = new Map();
      for (const r of data.rollouts) if (!groups.has(r.group_id)) groups.set(r.group_id, []);
      for (const r of sorted) groups.get(r.group_id).push(r);
      const boxes = [];
      for (const [gid, rs] of groups) {
        if (!rs.length) continue;
        const all = data.rollouts.filter((r) => r.group_id === gid);
        const ok = all.filter((r) => r.status === 'ok' && isNum(r.reward)).map((r) => r.reward);
        boxes.push(h('div', { class: 'group panel', 'data-group': gid },
          h('div', { class: 'ghead' }, h('strong', {}, gid), h('span', { class: 'muted' }, `${all.length} rollouts · mean reward ${fmt(mean(ok))}`), h('span', { class: 'payload' }, short(jsonText(all[0].payload), 200))),
          h('table', { class: 'rtable' }, head(), h('tbody', {}, rs.map((r) => rowOf(r, index.get(r.rollout_id)))))));
      }
      listBox.replaceChildren(shown, ...boxes);
    };
    for (const el of [statusSel, parseSel, policySel, sortSel, groupBox]) el.addEventListener('change', draw);
    for (const el of [minIn, maxIn]) el.addEventListener('input', draw);
    draw();
    const summary = h('div', { class: 'cards' },
      h('div', { class: 'card' }, h('div', { class: 'label' }, 'rollouts'), h('div', { class: 'value' }, String(data.rollouts.length))),
      h('div', { class: 'card', id: 'step-reward' }, h('div', { class: 'label' }, 'mean reward (ok)'), h('div', { class: 'value' }, fmt(record ? record['reward/mean'] : mean(data.rollouts.filter((r) => r.status === 'ok').map((r) => r.reward))))),
      h('div', { class: 'card' }, h('div', { class: 'label' }, 'by status'), h('div', { class: 'value', style: { fontSize: '14px' } }, Object.entries(counts).map(([s, c]) => h('span', {}, badge(s), ' ', String(c), ' ')))));
    frame('step', [link(`/step/${kind}/${n}`, `${kind} step ${n}`)],
      h('h1', {}, kind === 'eval' ? `Evaluation at step ${n}` : `Step ${n}`),
      navLinks,
      data.partial ? h('p', { class: 'note' }, 'This trace file is cut short (still being copied, or damaged): the rollouts before the cut are shown.') : null,
      summary,
      h('div', { class: 'controls' }, h('label', {}, 'status '), statusSel, parseSeen.length ? [h('label', {}, 'tool-call parse '), parseSel] : null, showPolicies ? [h('label', {}, 'policy '), policySel] : null, h('label', {}, 'reward from '), minIn, h('label', {}, 'to '), maxIn, h('label', {}, 'sort '), sortSel, h('label', {}, groupBox, ' group by prompt')),
      listBox);
  }

  // ---------------------------------------------------------------- trajectory
  // A turn a weight update interrupted went on under the new weights: one version per segment.
  function weightsBadge(node) {
    const vs = node.weight_versions && node.weight_versions.length > 1 ? node.weight_versions : null;
    return vs
      ? h('span', { class: 'badge segmented', title: 'interrupted by a weight update: the turn went on under the new weights, each part with its own version and logprobs' }, `weights ${vs.map((v) => 'v' + v).join('→')}`)
      : h('span', { class: 'badge' }, `weights v${node.weight_version}`);
  }
  function messageBox(node) {
    return (node.messages || []).map((m) => {
      const role = String(m.role || '?');
      const head = h('div', { class: 'role' }, role);
      if (node.turn !== null && node.turn !== undefined) head.append(h('span', { class: 'badge info' }, `turn ${node.turn + 1}`), weightsBadge(node), h('span', { class: 'badge' }, String(node.finish_reason)));
      if (node.parse) head.append(parseBadge(node.parse, node.parse_detail, 'parse: ' + node.parse));
      if (node.policy) head.append(policyBadge(node.policy));
      if (m.name) head.append(h('span', { class: 'mono' }, String(m.name)));
      if (m.tool_call_id) head.append(h('span', { class: 'mono muted' }, String(m.tool_call_id)));
      const box = h('div', { class: 'msg ' + role.replace(/[^a-z]/g, ''), 'data-role': role }, head);
      const thought = m.reasoning_content || m.reasoning;
      if (thought) box.appendChild(h('details', { class: 'reasoning', open: true }, h('summary', {}, 'reasoning'), h('pre', {}, jsonText(thought))));
      if (node.parse_detail) box.appendChild(h('p', { class: 'note parse-detail' }, `tool call ${node.parse}: ${node.parse_detail}`));
      const content = m.content;
      if (content !== null && content !== undefined && content !== '') box.appendChild(h('pre', { class: 'content' }, jsonText(content)));
      for (const call of m.tool_calls || []) {
        const fn = call.function || call;
        box.appendChild(h('div', { class: 'call mono' }, '→ ', h('strong', {}, String(fn.name)), '(', jsonText(fn.arguments), ')'));
      }
      return box;
    });
  }
  function conversation(nodes) {
    const kids = nodes.map(() => []);
    const roots = [];
    nodes.forEach((nd, i) => (nd.parent < 0 ? roots.push(i) : kids[nd.parent].push(i)));
    const branch = (start) => {
      const out = [];
      let cur = start;
      while (cur !== undefined) {
        out.push(...messageBox(nodes[cur]));
        const ch = kids[cur];
        if (ch.length === 1) cur = ch[0];
        else { if (ch.length > 1) out.push(fork(ch)); cur = undefined; }
      }
      return out;
    };
    const fork = (list) => h('div', { class: 'fork' }, list.map((c, k) => h('div', { class: 'branch' }, h('div', { class: 'bhead' }, `branch ${k + 1} of ${list.length}`), branch(c))));
    if (!roots.length) return h('p', { class: 'muted' }, 'No conversation recorded (the rollout made no model call).');
    return h('div', { class: 'conv', id: 'conversation' }, roots.length === 1 ? branch(roots[0]) : fork(roots));
  }
  function tokenRow(row, limit) {
    const n = row.token_ids.length;
    const trained = row.mask.reduce((a, b) => a + b, 0);
    const head = h('div', { class: 'rowhead' }, h('strong', {}, `row ${row.row_index}`),
      h('span', { class: 'muted' }, `${fmtInt(n)} tokens · ${fmtInt(trained)} trained · prompt ${fmtInt(row.prompt_length)}`),
      row.turns.map(([s, e, fin, v], k) => {
        const segs = (row.segments || [])[k] || [];
        const vs = segs.length > 1 ? segs.map((g) => 'v' + g[2]).join('→') : 'v' + v;
        return h('span', { class: 'badge info' + (segs.length > 1 ? ' segmented' : '') }, `turn ${k + 1}: ${s}–${e} · ${vs} · ${fin}`);
      }),
      (row.parse || []).map((p, k) => (p ? parseBadge(p.status, p.detail, `turn ${k + 1} parse: ${p.status}`) : null)),
      row.policy && row.policy !== DEFAULT_POLICY ? policyBadge(row.policy) : null,
      row.metadata && row.metadata.truncated ? h('span', { class: 'badge bad' }, 'truncated') : null);
    const buckets = Math.min(n, 1200);
    const strip = h('svg:svg', { class: 'strip', viewBox: `0 0 ${Math.max(1, buckets)} 10`, preserveAspectRatio: 'none' });
    for (let b = 0; b < buckets; b++) {
      const s = Math.floor((b * n) / buckets), e = Math.max(s + 1, Math.floor(((b + 1) * n) / buckets));
      const ps = [];
      for (let i = s; i < e; i++) if (row.mask[i]) ps.push(Math.exp(row.logprobs[i]));
      strip.appendChild(h('svg:rect', { x: b, y: 0, width: 1.02, height: 10, fill: ps.length ? heat(mean(ps)) : '#e5e7eb' }));
    }
    const starts = new Map(row.turns.map(([s, , fin, v], k) => [s, `turn ${k + 1} · v${v}`]));
    // Each token's weight version; a weight update's segment boundary gets its own marker.
    const version = new Array(n).fill(null);
    row.turns.forEach(([s, e, , v], k) => {
      for (let i = s; i < e; i++) version[i] = v;
      ((row.segments || [])[k] || []).forEach(([gs, ge, gv], j) => {
        for (let i = gs; i < ge; i++) version[i] = gv;
        if (j > 0) starts.set(gs, `v${gv} · weight update: turn ${k + 1} goes on under new weights`);
      });
    });
    const toks = h('div', { class: 'tokens', 'data-row': row.row_index });
    const upto = Math.min(n, limit);
    const frag = document.createDocumentFragment();
    for (let i = 0; i < upto; i++) {
      if (starts.has(i)) frag.appendChild(h('span', { class: 'turnmark' }, starts.get(i)));
      const text = row.texts[i];
      const shown = text === '' ? `⟨${row.token_ids[i]}⟩` : text.replace(/\n/g, '↵\n');
      const on = row.mask[i] === 1;
      const cls = 'tok ' + (on ? 'trained' : 'ctx') + (/^<\|.*\|>$|^<\/?s>$/.test(text) ? ' special' : '');
      const span = h('span', { class: cls, 'data-i': i, 'data-id': row.token_ids[i] }, shown);
      if (on) {
        const p = Math.exp(row.logprobs[i]);
        span.style.background = heat(p);
        span.setAttribute('data-lp', row.logprobs[i]);
        span.title = `#${i} id ${row.token_ids[i]} · logprob ${row.logprobs[i].toFixed(4)} · p ${p.toFixed(3)}` + (version[i] === null ? '' : ` · weights v${version[i]}`);
      } else {
        span.title = `#${i} id ${row.token_ids[i]} · context (not trained)`;
      }
      frag.appendChild(span);
    }
    toks.appendChild(frag);
    if (upto < n) toks.appendChild(h('button', { onclick: (evt) => { evt.target.closest('.rowbox').replaceWith(tokenRow(row, Infinity)); } }, `show all ${fmtInt(n)} tokens`));
    toks.addEventListener('mouseover', (evt) => {
      const t = evt.target.closest('.tok');
      const hover = document.getElementById('hover');
      if (!t || !hover) return;
      hover.textContent = t.title;
      hover.style.display = 'block';
    });
    toks.addEventListener('mouseleave', () => { const hv = document.getElementById('hover'); if (hv) hv.style.display = 'none'; });
    const meta = h('details', { class: 'rowmeta' }, h('summary', {}, 'row metadata (gateway counters, sampling settings per turn)'), h('pre', {}, JSON.stringify(row.metadata || {}, null, 1)));
    return h('div', { class: 'rowbox panel' }, head, strip, toks, meta);
  }
  function rolloutBody(r, compact) {
    const faults = Object.entries(r.faults || {}).filter(([k, v]) => v && k !== 'model_turns').map(([k, v]) => `${k} ${v}`).join(', ');
    const versions = [...new Set(r.rows.flatMap((row) => row.turns.flatMap((t, k) => {
      const segs = (row.segments || [])[k] || [];
      return segs.length ? segs.map((g) => g[2]) : [t[3]];
    })))].sort((a, b) => a - b);
    const kv = h('div', { class: 'kv' },
      h('span', { class: 'k' }, 'status'), h('span', { id: 'rollout-status' }, badge(r.status)),
      h('span', { class: 'k' }, 'reward'), h('span', { id: 'rollout-reward' }, fmt(r.reward)),
      h('span', { class: 'k' }, 'advantage'), h('span', {}, fmt(r.advantage)),
      h('span', { class: 'k' }, 'group'), h('span', { class: 'mono' }, r.group_id),
      h('span', { class: 'k' }, 'duration'), h('span', {}, fmt(r.elapsed_s, 2) + ' s'),
      h('span', { class: 'k' }, 'weights'), h('span', {}, versions.map((v) => 'v' + v).join(' ') || '–'),
      h('span', { class: 'k' }, 'faults'), h('span', {}, faults || 'none'),
      h('span', { class: 'k' }, 'agent metrics'), h('span', { class: 'mono' }, jsonText(r.metrics || {})),
      h('span', { class: 'k' }, 'payload'), h('span', { class: 'mono payload-full' }, jsonText(r.payload)),
      compact ? null : h('span', { class: 'k' }, 'rollout id'), compact ? null : h('span', { class: 'mono' }, r.rollout_id));
    const rows = r.rows.length
      ? r.rows.map((row) => tokenRow(row, compact ? 4000 : 20000))
      : [h('p', { class: 'muted' }, 'No trace rows: the gateway recorded no turn for this rollout.')];
    return [h('div', { class: 'panel' }, kv, r.error ? h('pre', { class: 'error', id: 'rollout-error' }, r.error) : null),
      h('h2', {}, 'Conversation'), conversation(r.conversation || []),
      h('h2', {}, 'Tokens'),
      h('div', { class: 'legend' }, h('span', { class: 'scale' }, 'trained tokens, p = exp(logprob):', h('i', { style: { background: heat(0) } }), '0', h('i', { style: { background: heat(0.5) } }), '0.5', h('i', { style: { background: heat(1) } }), '1'), h('span', { class: 'muted' }, 'grey: context (prompt, tool results, turns trained in another row)')),
      rows];
  }
  async function viewRollout(kind, n, id) {
    if (!RUN) RUN = await api.run();
    const [r, step] = await Promise.all([api.rollout(kind, n, id), api.step(kind, n).catch(() => null)]);
    let nav = null;
    if (step) {
      const ids = step.rollouts.map((x) => x.rollout_id);
      const at = ids.indexOf(id);
      nav = h('p', {}, link(`/step/${kind}/${n}`, `← all rollouts of ${kind} step ${n}`), ' · ',
        at > 0 ? link(`/rollout/${kind}/${n}/${enc(ids[at - 1])}`, '‹ previous') : 'first', ' · ',
        at < ids.length - 1 ? link(`/rollout/${kind}/${n}/${enc(ids[at + 1])}`, 'next ›') : 'last');
    }
    frame('rollout', [link(`/step/${kind}/${n}`, `${kind} step ${n}`), h('span', {}, 'rollout ' + id.slice(0, 8))],
      h('h1', {}, `Rollout ${id.slice(0, 12)} `, badge(r.status)), nav, ...rolloutBody(r, false));
  }

  // ---------------------------------------------------------------- compare
  async function viewCompare(a, b, g) {
    if (!RUN) RUN = await api.run();
    const evals = RUN.traces.eval;
    if (!evals.length) {
      frame('compare', [h('span', {}, 'compare')], h('h1', {}, 'Compare'), h('p', { class: 'note' }, 'This run stored no eval traces (no eval set, or trainer.save_traces=0).'));
      return;
    }
    a = evals.includes(a) ? a : evals[0];
    b = evals.includes(b) ? b : evals[evals.length - 1];
    const [sa, sb] = await Promise.all([api.step('eval', a), api.step('eval', b)]);
    const groups = [...new Set(sa.rollouts.map((r) => r.group_id))];
    g = groups.includes(g) ? g : groups[0];
    const go = (na, nb, ng) => { location.hash = `#/compare/${na}/${nb}/${enc(ng)}`; };
    const selA = h('select', { id: 'compare-a' }, evals.map((s) => h('option', { value: s }, `eval at step ${s}`)));
    const selB = h('select', { id: 'compare-b' }, evals.map((s) => h('option', { value: s }, `eval at step ${s}`)));
    const selG = h('select', { id: 'compare-prompt' }, groups.map((x) => {
      const r = sa.rollouts.find((q) => q.group_id === x);
      return h('option', { value: x }, `${x}: ${short(jsonText(r.payload), 60)}`);
    }));
    selA.value = String(a); selB.value = String(b); selG.value = g;
    selA.addEventListener('change', () => go(selA.value, b, g));
    selB.addEventListener('change', () => go(a, selB.value, g));
    selG.addEventListener('change', () => go(a, b, selG.value));
    const side = async (n, st) => {
      const hit = st.rollouts.find((r) => r.group_id === g);
      if (!hit) return h('div', { class: 'panel' }, h('p', { class: 'note' }, `prompt ${g} was not evaluated at step ${n}`));
      const r = await api.rollout('eval', n, hit.rollout_id);
      return h('div', { class: 'side', 'data-step': n }, h('h2', {}, `checkpoint at step ${n} `, badge(r.status), ' reward ', fmt(r.reward)), ...rolloutBody(r, true));
    };
    const [left, right] = await Promise.all([side(a, sa), side(b, sb)]);
    frame('compare', [h('span', {}, 'compare')],
      h('h1', {}, 'Same eval prompt at two checkpoints'),
      h('div', { class: 'controls' }, h('label', {}, 'left '), selA, h('label', {}, 'right '), selB, h('label', {}, 'prompt '), selG),
      h('div', { class: 'cols' }, left, right));
  }

  // ---------------------------------------------------------------- routing
  async function route() {
    if (pollTimer) { clearTimeout(pollTimer); pollTimer = null; }
    const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
    try {
      if (parts[0] === 'step' && parts.length >= 3) await viewStep(parts[1], Number(parts[2]));
      else if (parts[0] === 'rollout' && parts.length >= 4) await viewRollout(parts[1], Number(parts[2]), parts.slice(3).join('/'));
      else if (parts[0] === 'compare') await viewCompare(Number(parts[1]), Number(parts[2]), parts[3]);
      else { await viewOverview(); if (!STATIC) schedulePoll(); }
    } catch (err) {
      frame('error', [], h('h1', {}, 'Cannot show this'), h('p', { class: 'note', id: 'error' }, String(err && err.message ? err.message : err)), h('p', {}, link('/', 'back to the overview')));
    }
    const live = document.getElementById('live');
    if (live && RUN) live.textContent = `live · ${RUN.steps.length} steps · read ${new Date().toLocaleTimeString()}`;
  }
  function schedulePoll() {
    pollTimer = setTimeout(async () => {
      pollTimer = null;
      try {
        const fresh = await api.run();
        const changed = !RUN || fresh.updated !== RUN.updated || fresh.traces.train.length !== RUN.traces.train.length || fresh.traces.eval.length !== RUN.traces.eval.length;
        const here = location.hash.replace(/^#\/?/, '') === '';
        if (changed && here) { await route(); return; }
      } catch (e) { /* the server may be restarting; try again */ }
      if (location.hash.replace(/^#\/?/, '') === '') schedulePoll();
    }, 4000);
  }
  window.addEventListener('hashchange', () => { route(); window.scrollTo(0, 0); });
  route();
})();
