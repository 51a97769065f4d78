// embodyrl operator console: renders the state the server pushes on /ws and posts operator actions
// to /api/action. The contract is notes/console_contract.md. No framework and no build step: the DOM
// of each actor and device is built once and then updated in place, so buttons and inputs keep focus
// and camera images are not reloaded on every 0.25 s state message.
'use strict';

// ---------------------------------------------------------------- helpers

// Off loopback the server wants the token the page was opened with on every request.
const TOKEN = new URLSearchParams(location.search).get('token');
function withToken(url) {
  if (!TOKEN) return url;
  return url + (url.includes('?') ? '&' : '?') + 'token=' + encodeURIComponent(TOKEN);
}

const $ = (sel, root = document) => root.querySelector(sel);

// h('button', {class: 'x', text: 'Go', onclick: f, 'data-a': 1}, child...) -> element
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) if (c != null) el.append(c);
  return el;
}

// Writing only on change keeps text selectable and avoids needless layout at 4 messages/s.
function setText(el, value) {
  const s = value == null ? '' : String(value);
  if (el.textContent !== s) el.textContent = s;
}

function fnum(v, digits) {
  if (v == null || typeof v !== 'number' || Number.isNaN(v)) return v == null ? '–' : String(v);
  if (digits === undefined && Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (digits === undefined) {
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    digits = a >= 100 ? 1 : a >= 1 ? 2 : 3;
  }
  return v.toFixed(digits);
}

function fage(s) {
  if (s == null) return '–';
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

const fclock = (unix) => (unix == null ? '–' : new Date(unix * 1000).toLocaleTimeString([], {hour12: false}));

// ---------------------------------------------------------------- connection

const conn = {ws: null, kind: 'connecting', retries: 0, timer: null, lastMsg: 0, finished: false};

function setConn(kind) {
  conn.kind = kind;
  showStatus();
}

// #status carries the connection state; a finished run is shown there too because "live" would
// suggest a robot is running when the page only shows the run's metrics.jsonl.
function showStatus() {
  const el = $('#status');
  const text = {live: 'live', connecting: 'connecting', reconnecting: 'reconnecting', unauthorised: 'not authorised'}[conn.kind];
  const finished = conn.kind === 'live' && conn.finished;
  setText(el, finished ? 'finished run (from metrics.jsonl)' : text);
  el.dataset.conn = conn.kind;
  el.className = 'conn ' + conn.kind + (finished ? ' finished' : '');
  document.body.classList.toggle('stale', conn.kind !== 'live');
}

function showAuthError() {
  $('#auth-error').hidden = false;
  clearTimeout(conn.timer);
  setConn('unauthorised');
}

function connect() {
  clearTimeout(conn.timer);
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  let ws;
  try {
    ws = new WebSocket(withToken(`${proto}//${location.host}/ws`));
  } catch (e) {
    console.warn('websocket', e);
    return scheduleReconnect();
  }
  conn.ws = ws;
  let opened = false;
  ws.onopen = () => {
    opened = true;
    conn.retries = 0;
    conn.lastMsg = Date.now();
    $('#auth-error').hidden = true;
    setConn('live');
  };
  ws.onmessage = (ev) => {
    conn.lastMsg = Date.now();
    let msg;
    try { msg = JSON.parse(ev.data); } catch (e) { console.warn('bad message', e); return; }
    if (msg && msg.t === 'state') render(msg);
  };
  ws.onclose = (ev) => {
    if (conn.ws !== ws) return;  // a socket we already gave up on
    conn.ws = null;
    if (ev.code === 4401) return showAuthError();
    // A handshake refused with HTTP 401 reaches the page only as code 1006: ask a plain endpoint why.
    if (!opened) probeAuth().then((denied) => (denied ? showAuthError() : scheduleReconnect()));
    else scheduleReconnect();
  };
}

function probeAuth() {
  return fetch(withToken('/api/state'), {cache: 'no-store'})
    .then((r) => r.status === 401)
    .catch(() => false);
}

function scheduleReconnect() {
  setConn('reconnecting');
  // Exponential backoff with jitter, capped, so a restarting server is not hammered by every page.
  const delay = Math.min(8000, 500 * 2 ** conn.retries) * (0.75 + 0.5 * Math.random());
  conn.retries = Math.min(conn.retries + 1, 10);
  clearTimeout(conn.timer);
  conn.timer = setTimeout(connect, delay);
}

// A socket that stays open but silent (server hung, network half-dead) must not look live.
setInterval(() => {
  const ws = conn.ws;
  if (ws && ws.readyState === WebSocket.OPEN && Date.now() - conn.lastMsg > 5000) {
    conn.ws = null;
    ws.onclose = null;
    ws.close();
    scheduleReconnect();
  }
}, 1000);

// ---------------------------------------------------------------- actions

function describe(action, actor, device, value) {
  if (action === 'pause_training' || action === 'resume_training') return `${action} (learner)`;
  const target = actor == null ? 'all' : device == null ? `actor ${actor}` : `actor ${actor} device ${device}`;
  if (action === 'stream') return `stream ${target}: ${value.fps} fps, ${value.width} px`;
  if (action === 'answer') return `answer ${value} ${target}`;
  return `${action} ${target}`;
}

// Shows an action's outcome in the global result list and, when given, in the card it came from.
// Failures stay red with their error text until the next action there: nothing is silenced.
function report(local, status, text) {
  const list = $('#action-result');
  const entry = h('div', {class: 'result-entry', 'data-status': status});
  list.prepend(entry);
  while (list.children.length > 4) list.lastChild.remove();
  const set = (st, txt) => {
    for (const el of [entry, local]) {
      if (!el) continue;
      el.dataset.status = st;
      setText(el, `${fclock(Date.now() / 1000)}  ${txt}`);
    }
  };
  set(status, text);
  return set;
}

async function act(action, actor, device, value = null, local = null) {
  const what = describe(action, actor, device, value);
  const set = report(local, 'pending', `${what}: sending…`);
  try {
    const res = await fetch(withToken('/api/action'), {
      method: 'POST',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({action, actor, device, value}),
    });
    let body = null;
    try { body = await res.json(); } catch (_) { /* an error page that is not JSON */ }
    if (res.status === 401) showAuthError();
    if (!res.ok) throw new Error(`HTTP ${res.status}${body && body.error ? ': ' + body.error : ''}`);
    if (!body || !body.status) throw new Error('malformed response from server');
    const results = body.results || [];
    const bad = results.filter((r) => !r.ok);
    if (body.status === 'ok' && bad.length === 0) {
      const ms = results.map((r) => r.ms).filter((m) => m != null);
      const timing = ms.length ? `, ${fnum(Math.max(...ms), 1)} ms` : '';
      set('ok', `${what}: ok (${results.length} target${results.length === 1 ? '' : 's'}${timing})`);
    } else {
      const errs = bad.map((r) => `${r.target}: ${r.error || 'failed'}`);
      if (body.error && !errs.some((e) => e.includes(body.error))) errs.unshift(body.error);
      set('failed', `${what}: FAILED (${results.length - bad.length}/${results.length} ok) ${errs.join('; ')}`);
    }
  } catch (e) {
    const msg = e instanceof TypeError ? `network error (${e.message})` : (e.message || String(e));
    set('failed', `${what}: FAILED ${msg}`);
  }
}

// The global bar: every actor and device (actor null, device null), or the learner.
const GLOBAL = {'estop-all': 'estop', 'clear-all': 'clear_estop', 'pause-all': 'pause', 'resume-all': 'resume',
  'pause-training': 'pause_training', 'resume-training': 'resume_training'};
for (const [id, action] of Object.entries(GLOBAL)) document.getElementById(id).onclick = () => act(action, null, null);

// ---------------------------------------------------------------- learner

function renderLearner(L) {
  $('#learner').classList.toggle('absent', !L);
  const pill = $('#learner-conn');
  if (!L) {
    setText(pill, 'no learner');
    pill.className = 'pill bad';
    $('#pause-training').disabled = $('#resume-training').disabled = false;
    for (const id of ['env-steps', 'updates-per-s', 'policy-version', 'policy-age', 'updates', 'training', 'replay-size']) {
      setText($('#learner-' + id), '–');
    }
    $('#learner-budget').hidden = true;
    return;
  }
  setText(pill, L.connected ? 'connected' : `gone, last seen ${fage(L.last_seen_s)} ago`);
  pill.className = 'pill ' + (L.connected ? 'good' : 'bad');
  setText($('#learner-peer'), L.peer || '');  // its key's name, or its connection: who holds the place
  const skipped = L.nonfinite_updates_skipped;
  $('#learner-nonfinite-box').hidden = skipped == null;
  setText($('#learner-nonfinite'), skipped ?? '–');
  $('#learner-nonfinite').className = 'num ' + (skipped ? 'warn' : 'good');
  setText($('#learner-env-steps'), Math.round(L.env_steps ?? 0));
  const hasBudget = L.budget != null && L.budget > 0;
  $('#learner-budget').hidden = !hasBudget;
  if (hasBudget) {
    const frac = Math.min(1, (L.env_steps ?? 0) / L.budget);
    $('#learner-progress').style.width = `${(100 * frac).toFixed(2)}%`;
    setText($('#learner-budget-text'), `of ${L.budget} (${(100 * frac).toFixed(1)} %)`);
  }
  setText($('#learner-updates-per-s'), fnum(L.updates_per_s, 1));
  setText($('#learner-policy-version'), L.policy_version ?? '–');
  setText($('#learner-policy-age'), typeof L.policy_age === 'number' ? `${fnum(L.policy_age, 0)} updates` : '–');
  setText($('#learner-updates'), L.updates ?? '–');
  const tr = $('#learner-training');
  setText(tr, L.training ?? '–');
  tr.className = 'num ' + (L.training === 'paused' || L.training === 'gone' ? 'warn' : 'good');
  // Only the button that changes something is enabled; neither once the learner is finished or gone.
  const training = L.training === 'running' || L.training === 'paused';
  $('#pause-training').disabled = !training || L.training === 'paused';
  $('#resume-training').disabled = !training || L.training === 'running';

  const replay = L.replay || {};
  setText($('#learner-replay-size'), replay.size ?? '–');
  renderKV($('#learner-replay'), replay.by_source || {}, (v) => fnum(v));
  renderKV($('#learner-losses'), L.losses || {}, (v) => fnum(v));
}

// Small name/value list, rebuilt only when its content changes.
function renderKV(el, obj, fmt) {
  const sig = JSON.stringify(obj);
  if (el._sig === sig) return;
  el._sig = sig;
  const entries = Object.entries(obj);
  el.replaceChildren(...entries.map(([k, v]) =>
    h('span', {class: 'kv-item' + (v ? '' : ' zero'), 'data-key': k}, h('label', {text: k}), h('b', {text: fmt(v)}))));
  if (!entries.length) el.append(h('span', {class: 'muted', text: 'none'}));
}

// ---------------------------------------------------------------- charts

const PALETTE = ['#4aa3ff', '#ffb020', '#3ddc84', '#ff5c8a', '#b388ff', '#22d3d3', '#ff8a3d', '#c0ca33'];
const CHART_H = 240;
const charts = {};  // container id -> {plot, key}

const axis = (extra = {}) => ({
  stroke: '#9aa4b2',
  grid: {stroke: 'rgba(255,255,255,0.07)', width: 1},
  ticks: {stroke: 'rgba(255,255,255,0.15)', width: 1},
  ...extra,
});

// Null is a gap, so a value next to a null has at most one line segment (none if isolated) and
// sparse or interleaved series would vanish once uPlot hides its points: draw those values as dots.
function gapEdgePoints(u, si, show) {
  if (show) return null;
  const d = u.data[si];
  const idx = [];
  for (let i = 0; i < d.length; i++) {
    if (d[i] != null && (d[i - 1] == null || d[i + 1] == null)) idx.push(i);
  }
  return idx.length ? idx : null;
}

function makeChart(id, title, names, range) {
  const el = document.getElementById(id);
  const opts = {
    title,
    width: Math.max(200, el.clientWidth - 16),
    height: CHART_H,
    scales: {x: {time: false}, y: range ? {auto: false, range} : {}},
    axes: [axis({label: 'env steps', labelSize: 20, size: 36}), axis({size: 56})],
    series: [
      {label: 'env steps'},
      ...names.map((n, i) => ({
        label: n, stroke: PALETTE[i % PALETTE.length], width: 2, spanGaps: false,
        points: {size: 4, filter: gapEdgePoints}, value: (u, v) => fnum(v),
      })),
    ],
    cursor: {drag: {x: false, y: false}},
    hooks: {setLegend: [latestLegend]},
  };
  el.replaceChildren();
  const plot = new uPlot(opts, [[], ...names.map(() => [])], el);
  // Charts follow their grid cell when the window or the layout changes.
  if (!el._ro) {
    el._ro = new ResizeObserver(() => {
      const c = charts[id];
      if (c) c.plot.setSize({width: Math.max(200, el.clientWidth - 16), height: CHART_H});
    });
    el._ro.observe(el);
  }
  return plot;
}

// Creates the chart once per set of series and afterwards only swaps its data.
function updateChart(id, title, xs, table, names, range) {
  const key = names.join('\u0001');
  let c = charts[id];
  if (!c || c.key !== key) {
    if (c) c.plot.destroy();
    c = charts[id] = {key, plot: makeChart(id, title, names, range)};
  }
  const n = xs.length;
  // Columns of a different length than env_steps would break uPlot: pad with gaps / cut.
  const col = (name) => {
    const a = Array.isArray(table[name]) ? table[name] : [];
    return a.length === n ? a : Array.from({length: n}, (_, i) => (a[i] ?? null));
  };
  c.plot.setData([xs, ...names.map(col)]);
}

// Outside a hover the legend shows each series' latest value instead of dashes. uPlot resets the
// legend after every redraw, hence a hook; passing false keeps it from firing itself again.
function latestLegend(u) {
  if (u.cursor.idx != null || !u.data[0].length) return;
  const lastIdx = (a) => { let i = a.length - 1; while (i >= 0 && a[i] == null) i--; return i >= 0 ? i : null; };
  u.setLegend({idxs: u.data.map(lastIdx)}, false);
}

function renderCharts(s) {
  const curves = s.curves || {};
  const xs = Array.isArray(curves.env_steps) ? curves.env_steps : [];
  updateChart('chart-return', 'episode return', xs, curves, ['episode_return']);
  updateChart('chart-rates', 'success / intervention rate', xs, curves, ['success_rate', 'intervention_rate'], [0, 1]);
  const losses = s.losses || {};
  const lx = Array.isArray(losses.env_steps) ? losses.env_steps : [];
  const names = Object.keys(losses).filter((k) => k !== 'env_steps').sort();
  updateChart('chart-losses', 'losses', lx, losses, names);
}

// ---------------------------------------------------------------- actors and devices

const actorUIs = new Map();  // actor_id -> ui

// Keeps one UI object (with .el) per id: builds new ones, updates all, drops those gone from the state.
function syncKeyed(map, items, idOf, build, update, parent) {
  const seen = new Set();
  for (const item of items) {
    const id = idOf(item);
    seen.add(id);
    let ui = map.get(id);
    if (!ui) {
      ui = build(item);
      map.set(id, ui);
      parent.append(ui.el);
    }
    update(ui, item);
  }
  for (const [id, ui] of map) if (!seen.has(id)) { ui.el.remove(); map.delete(id); }
  // Keep the state's order (by id), moving nodes only when it differs: a moved node loses focus.
  const wanted = items.map((item) => map.get(idOf(item)).el);
  const shown = Array.from(parent.children).filter((el) => wanted.includes(el));
  if (wanted.some((el, i) => shown[i] !== el)) for (const el of wanted) parent.append(el);
}

// A label/value pair for the stat grids; returns [element, value element].
function stat(label, cls) {
  const v = h('span', {class: 'v ' + cls});
  return [h('div', {class: 'stat'}, h('label', {text: label}), v), v];
}

function buildActor(a) {
  const id = a.actor_id;
  const ui = {id, devices: new Map(), streamDirty: false};
  ui.conn = h('span', {class: 'pill'});
  ui.learner = h('span', {class: 'pill'});
  ui.peer = h('span', {class: 'muted small peer', title: 'who holds this actor id: its key, or its connection'});
  ui.statusError = h('span', {class: 'pill bad status-error', hidden: true});
  const stats = h('div', {class: 'stats actor-stats'});
  for (const [label, key] of [['env steps', 'env-steps'], ['episodes', 'episodes'], ['link RTT', 'rtt'],
    ['resends', 'resends'], ['reconnects', 'reconnects'], ['spool batches/rows', 'spool'], ['reset', 'reset'], ['teleop', 'teleop']]) {
    const [el, v] = stat(label, key);
    stats.append(el);
    ui[key] = v;
  }

  // Camera stream control: the inputs are the operator's until applied, so state does not overwrite them.
  ui.fps = h('input', {type: 'number', min: 0, max: 60, step: 1, class: 'stream-fps', title: 'frames per second, 0 = off'});
  ui.width = h('select', {class: 'stream-width'}, ...[80, 160, 320, 640].map((w) => h('option', {value: w, text: `${w} px`})));
  const dirty = () => { ui.streamDirty = true; };
  for (const ev of ['input', 'change']) {
    ui.fps.addEventListener(ev, dirty);  // WebDriver's clear() blurs and fires only 'change'
    ui.width.addEventListener(ev, dirty);
  }
  ui.result = h('div', {class: 'result'});
  const apply = () => {
    ui.streamDirty = false;
    ui.streamHeldUntil = Date.now() + 2000;  // let the next states catch up with the new values
    const fps = Math.max(0, Number(ui.fps.value) || 0);
    act('stream', id, null, {fps, width: Number(ui.width.value)}, ui.result);
  };
  ui.fps.addEventListener('keydown', (e) => { if (e.key === 'Enter') apply(); });
  const stream = h('div', {class: 'stream'},
    h('label', {text: 'camera stream'}), ui.fps, h('span', {class: 'muted', text: 'fps'}), ui.width,
    h('button', {type: 'button', class: 'stream-apply', text: 'Apply', onclick: apply}));

  ui.devicesEl = h('div', {class: 'devices'});
  ui.el = h('section', {class: 'actor panel', 'data-actor': id},
    h('header', {class: 'actor-head'}, h('h2', {text: `Actor ${id}`}), ui.conn, ui.learner, ui.peer, ui.statusError),
    stats, stream, ui.result, ui.devicesEl);
  return ui;
}

function updateActor(ui, a) {
  ui.el.classList.toggle('disconnected', !a.connected);
  setText(ui.conn, a.connected ? `connected · ${fage(a.last_seen_s)} ago` : `DISCONNECTED · last seen ${fage(a.last_seen_s)} ago`);
  ui.conn.className = 'pill ' + (a.connected ? 'good' : 'bad');
  setText(ui.peer, a.peer || '');
  ui.statusError.hidden = !a.status_error;
  setText(ui.statusError, a.status_error || '');
  setText(ui.learner, `learner link ${a.learner}`);
  ui.learner.className = 'pill ' + (a.learner === 'connected' ? 'good' : 'bad');
  const link = a.link || {};
  setText(ui['env-steps'], a.env_steps ?? '–');
  setText(ui.episodes, a.episodes ?? '–');
  setText(ui.rtt, link.rtt_ms == null ? '–' : `${fnum(link.rtt_ms, 1)} ms`);
  setText(ui.resends, link.resends ?? '–');
  setText(ui.reconnects, link.reconnects ?? '–');
  setText(ui.spool, `${link.spool_batches ?? 0} / ${link.spool_rows ?? 0}`);
  ui.spool.classList.toggle('warn', (link.spool_batches || 0) > 0);
  ui.resends.classList.toggle('warn', (link.resends || 0) > 0);
  setText(ui.reset, a.reset ?? '–');
  setText(ui.teleop, a.teleop ? 'yes' : 'no');

  const st = a.stream || {};
  const editing = document.activeElement === ui.fps || document.activeElement === ui.width;
  if (!editing && !ui.streamDirty && !(Date.now() < (ui.streamHeldUntil || 0))) {
    if (st.fps != null && Number(ui.fps.value) !== st.fps) ui.fps.value = String(st.fps);
    if (st.width != null && ui.width.value !== String(st.width)) {
      // A width the select does not list is added so the real value is never misreported.
      if (![...ui.width.options].some((o) => o.value === String(st.width))) {
        ui.width.append(h('option', {value: st.width, text: `${st.width} px`}));
      }
      ui.width.value = String(st.width);
    }
  }

  syncKeyed(ui.devices, a.devices || [], (d) => d.device_id, (d) => buildDevice(a.actor_id, d),
    (dui, d) => updateDevice(dui, a, d), ui.devicesEl);
}

function buildDevice(actor, d) {
  const dev = d.device_id;
  const r = {cams: new Map()};
  r.result = h('div', {class: 'result'});
  const doAct = (action, value = null) => act(action, actor, dev, value, r.result);
  const btn = (cls, text, onclick) => h('button', {type: 'button', class: cls, text, onclick});

  r.name = h('h3');
  r.state = h('span', {class: 'estop-state'});
  r.reason = h('span', {class: 'estop-reason'});
  r.admin = h('span', {class: 'muted small admin-robot',
    title: "this console's admin key reaches the device's robot server: its e-stop latches as an admin's, its clear lifts one"});
  r.badge = h('div', {class: 'estop-badge'}, r.state, r.reason);
  r.paused = h('span', {class: 'badge paused', text: 'PAUSED', hidden: true});
  r.takeover = h('span', {class: 'badge takeover', text: 'TAKEOVER', hidden: true});

  r.estop = btn('estop', 'E-STOP', () => doAct('estop'));
  r.clear = btn('clear-estop', 'Clear e-stop', () => doAct('clear_estop'));
  // Toggles send what their label says; the label follows the device's state.
  r.pause = btn('pause-toggle', 'Pause', () => doAct(r.pause.dataset.action));
  r.take = btn('takeover-toggle', 'Take over', () => doAct(r.take.dataset.action));

  r.summary = h('div', {class: 'prompt-summary'});
  r.go = btn('answer-go', 'Go', () => doAct('answer', 'go'));
  r.prompt = h('div', {class: 'prompt', hidden: true},
    h('div', {class: 'prompt-title', text: 'Operator reset'}), r.summary,
    h('div', {class: 'buttons'}, r.go,
      btn('answer-success', 'Success', () => doAct('answer', 'success')),
      btn('answer-failure', 'Failure', () => doAct('answer', 'failure'))));

  r.step = h('span', {class: 'episode-step big'});
  r.ret = h('span', {class: 'episode-return big'});
  r.safety = h('div', {class: 'safety chips'});
  r.watchdog = h('span', {class: 'watchdog-trips'});
  r.camsEl = h('div', {class: 'cams'});

  r.el = h('div', {class: 'device', 'data-actor': actor, 'data-device': dev},
    h('div', {class: 'device-head'}, r.name, r.paused, r.takeover, r.estop),
    r.badge, r.admin,
    h('div', {class: 'buttons'}, r.clear, r.pause, r.take),
    r.prompt,
    h('div', {class: 'episode'},
      h('div', {}, h('label', {text: 'episode step'}), r.step),
      h('div', {}, h('label', {text: 'return'}), r.ret)),
    h('div', {class: 'safety-row'}, h('label', {text: 'safety'}), r.safety,
      h('label', {text: 'watchdog trips'}), r.watchdog),
    r.camsEl, r.result);
  return r;
}

function updateDevice(r, a, d) {
  setText(r.name, d.name ? `${d.name} (device ${d.device_id})` : `device ${d.device_id}`);
  r.el.classList.toggle('estopped', !!d.estopped);
  r.badge.classList.toggle('latched', !!d.estopped);
  setText(r.state, d.estopped ? 'E-STOPPED' : 'ok');
  setText(r.reason, d.estopped ? `: ${d.estop_reason || 'no reason given'}` : '');
  r.clear.disabled = !d.estopped && !d.admin_robot;  // the robot server may hold a latch the actor has not seen
  setText(r.admin, d.admin_robot ? `admin key: ${d.admin_robot}` : '');
  r.paused.hidden = !d.paused;
  r.takeover.hidden = !d.takeover;

  r.pause.dataset.action = d.paused ? 'resume' : 'pause';
  setText(r.pause, d.paused ? 'Resume' : 'Pause');
  r.take.dataset.action = d.takeover ? 'release' : 'takeover';
  setText(r.take, d.takeover ? 'Release' : 'Take over');
  // Without a teleop source takeover can only fail; a takeover already on can still be released.
  r.take.disabled = !a.teleop && !d.takeover;
  r.take.title = a.teleop ? '' : 'this actor has no teleop source';
  if (a.connected === false) {  // a finished or gone actor takes no command: its controls are off
    for (const b of [r.estop, r.clear, r.pause, r.take]) b.disabled = true;
  } else {
    r.estop.disabled = r.pause.disabled = false;
  }

  const p = d.prompt;
  r.prompt.hidden = !p;
  if (p) {
    setText(r.summary, p.summary);
    r.go.hidden = !p.allow_go;
  }

  const ep = d.episode || {};
  setText(r.step, ep.step ?? '–');
  setText(r.ret, fnum(ep.return, 2));
  renderSafety(r.safety, d.safety || {});
  setText(r.watchdog, d.watchdog_trips ?? 0);
  r.watchdog.classList.toggle('warn', (d.watchdog_trips || 0) > 0);
  syncKeyed(r.cams, Object.entries(d.frames || {}), ([field]) => field,
    ([field]) => buildCam(a.actor_id, d.device_id, field), (cam, [, f]) => updateCam(cam, f), r.camsEl);
}

// Every kind in one compact row; non-zero counts are highlighted so they stand out.
function renderSafety(el, safety) {
  const sig = JSON.stringify(safety);
  if (el._sig === sig) return;
  el._sig = sig;
  el.replaceChildren(...Object.entries(safety).map(([k, v]) =>
    h('span', {class: 'chip' + (v ? ' hot' : ''), 'data-kind': k, text: `${k.replace(/_/g, ' ')} ${v}`})));
}

function buildCam(actor, dev, field) {
  const cam = {field, actor, dev, want: null, shown: null, loading: null, failed: null, since: 0};
  cam.img = h('img', {class: 'camera', alt: field, 'data-field': field});
  cam.img.onload = () => {
    cam.shown = cam.loading;
    cam.img.dataset.seq = String(cam.shown);
    cam.img.classList.remove('missing');
    cam.loading = null;
    loadFrame(cam);
  };
  cam.img.onerror = () => {
    cam.failed = cam.loading;  // not retried until the seq changes
    cam.img.classList.add('missing');
    cam.loading = null;
    loadFrame(cam);
  };
  cam.caption = h('figcaption');
  cam.el = h('figure', {class: 'cam'}, cam.img, cam.caption);
  return cam;
}

function updateCam(cam, f) {
  if (f.width && f.height) {
    cam.img.width = f.width;
    cam.img.height = f.height;
  }
  setText(cam.caption, `${cam.field} · ${f.width ?? '?'}×${f.height ?? '?'} · ${fage(f.age_s)} old`);
  cam.el.classList.toggle('old', (f.age_s ?? 0) > 2);
  cam.want = f.seq;
  loadFrame(cam);
}

// One frame request in flight per camera: setting src again while loading cancels the previous
// request, so over a slow link at 4 state messages/s the image would never finish loading.
function loadFrame(cam) {
  const stuck = cam.loading != null && Date.now() - cam.since > 5000;
  if ((cam.loading != null && !stuck) || cam.want == null) return;
  if (cam.want === cam.shown || cam.want === cam.failed) return;
  cam.loading = cam.want;
  cam.since = Date.now();
  const q = `actor=${cam.actor}&device=${cam.dev}&field=${encodeURIComponent(cam.field)}&seq=${cam.want}`;
  cam.img.src = withToken(`/frame?${q}`);
}

function renderActors(actors) {
  syncKeyed(actorUIs, actors, (a) => a.actor_id, buildActor, updateActor, $('#actors'));
  $('#no-actors').hidden = actors.length > 0;
}

// ---------------------------------------------------------------- action log

function renderLog(actions) {
  const rows = actions.slice(-20).reverse();
  const tbody = $('#action-log');
  const sig = JSON.stringify(rows);
  if (tbody._sig === sig) return;
  tbody._sig = sig;
  if (!rows.length) {
    tbody.replaceChildren(h('tr', {class: 'empty'}, h('td', {colspan: 7, class: 'muted', text: 'no actions yet'})));
    return;
  }
  tbody.replaceChildren(...rows.map((a) => h('tr', {class: 'action-entry', 'data-status': a.status, 'data-id': a.id},
    h('td', {text: fclock(a.time)}), h('td', {text: a.origin ?? ''}), h('td', {class: 'action', text: a.action}),
    h('td', {text: a.target ?? ''}), h('td', {class: 'status', text: a.status}),
    h('td', {class: 'ms', text: a.ms == null ? '' : fnum(a.ms, 1)}), h('td', {class: 'error', text: a.error || ''}))));
}

// ---------------------------------------------------------------- main

function render(s) {
  setText($('#run'), s.run || '');
  if (conn.finished !== !!s.finished) {
    conn.finished = !!s.finished;
    showStatus();
  }
  for (const id of Object.keys(GLOBAL)) {  // a finished run takes no command
    if (!id.endsWith('-training')) document.getElementById(id).disabled = conn.finished;
  }
  renderLearner(s.learner);
  renderCharts(s);
  renderActors(Array.isArray(s.actors) ? s.actors : []);
  renderLog(Array.isArray(s.actions) ? s.actions : []);
}

connect();
