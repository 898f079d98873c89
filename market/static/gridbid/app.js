// GridBid live updates: one WebSocket, pages declare what they watch.
// Pages work without this script; it only keeps them fresh (see docs/stream.md).
(function () {
  "use strict";
  // Money as market/money.py writes it: base units (6 decimals) as USDC, 2 to 6 decimals,
  // prices with their unit ("2.26 USDC/GPU-h"). Exact for any amount a Number holds.
  const figure = (v) => {
    const n = Math.round(Number(v)), whole = Math.trunc(Math.abs(n) / 1e6), frac = Math.abs(n) % 1e6;
    const digits = String(frac).padStart(6, "0").replace(/0+$/, "").padEnd(2, "0");
    return (n < 0 ? "-" : "") + whole.toLocaleString("en-US") + "." + digits;
  };
  const none = (v) => v === null || v === undefined;
  const money = (v) => none(v) ? "—" : figure(v);
  const usdc = (v) => none(v) ? "—" : figure(v) + " USDC";
  const price = (v) => none(v) ? "—" : figure(v) + " USDC/GPU-h";
  window.GridBidMoney = { figure, money, usdc, price };

  // Timestamps: the server writes <time class="ts" datetime="…Z">2026-12-04 13:25:07 UTC</time>;
  // here they read in the reader's own zone, in the same shape ("2026-12-04 14:25:07 CET").
  const stamp = (date) => {
    const parts = Object.fromEntries(new Intl.DateTimeFormat("en-CA", { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short" })
      .formatToParts(date).map((p) => [p.type, p.value]));
    return `${parts.year}-${parts.month}-${parts.day} ${parts.hour}:${parts.minute}:${parts.second} ${parts.timeZoneName}`;
  };
  const localTimes = (root) => root.querySelectorAll("time.ts[datetime]:not([data-local])").forEach((el) => {
    const d = new Date(el.getAttribute("datetime"));
    if (!isNaN(d)) { el.textContent = stamp(d); el.dataset.local = "1"; el.title = el.getAttribute("datetime"); }
  });
  // On a phone every table becomes one card per row (app.css, under 700 px), each cell labelled
  // with its column's heading; rows added live get their labels too
  const cardTables = (root) => root.querySelectorAll("table.grid").forEach((t) => {
    const heads = Array.from(t.querySelectorAll("thead th")).map((th) => th.textContent.trim());
    if (!heads.length) return;
    t.classList.add("cards");
    t.querySelectorAll("tbody tr").forEach((tr) => Array.from(tr.children).forEach((td, i) => {
      if (!td.dataset.label && heads[i] && td.colSpan === 1) td.dataset.label = heads[i];
    }));
  });
  localTimes(document);
  cardTables(document);
  new MutationObserver(() => { localTimes(document); cardTables(document); }).observe(document.body || document.documentElement, { childList: true, subtree: true });
  // a server's text ("expired unmatched at 2026-12-04 13:25:07 UTC") with its moments in the reader's zone
  const localStamps = (text) => String(text).replace(/(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2}) UTC/g, (all, d, t) => {
    const at = new Date(`${d}T${t}Z`);
    return isNaN(at) ? all : stamp(at);
  });
  window.GridBidTime = { stamp, localStamps };

  // The header menu on narrow screens: the links fold behind one button
  const menu = document.getElementById("menu-toggle"), topbar = document.querySelector(".topbar");
  if (menu && topbar) {
    topbar.classList.add("has-menu");
    menu.addEventListener("click", () => { const open = topbar.classList.toggle("menu-open"); menu.setAttribute("aria-expanded", open ? "true" : "false"); });
  }

  // Dangerous buttons (dispute, refund, ruling) ask first; the form then says it was confirmed
  document.addEventListener("click", (ev) => {
    const button = ev.target.closest && ev.target.closest("[data-confirm]");
    if (!button) return;
    if (!window.confirm(button.dataset.confirm)) { ev.preventDefault(); ev.stopImmediatePropagation(); return; }
    const confirmed = button.form && button.form.querySelector("input[name=confirmed]");
    if (confirmed) confirmed.value = "yes";
  }, true);
  // token base units exactly (the `tokens` template filter): money a provider checks against the chain
  const tokens = (v) => none(v) ? "—" : figure(v);
  const flash = (el) => { if (!el) return; el.classList.remove("flash"); void el.offsetWidth; el.classList.add("flash"); };
  const setText = (el, text) => { if (el && el.textContent !== text) { el.textContent = text; flash(el); } };
  const esc = (v) => String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" }[c]));
  const readJSON = (id) => { const el = document.getElementById(id); try { return el ? JSON.parse(el.textContent) : null; } catch (e) { return null; } };
  const ago = (iso) => {
    if (!iso) return "never";
    const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    return s < 2 ? "just now" : s < 90 ? `${s} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago` : `${Math.round(s / 3600)} h ago`;
  };
  const pill = (el, state) => { if (el && el.textContent !== state) { el.textContent = state; el.className = "pill state-" + state; flash(el); } };
  const handlers = {};
  const last = {};
  let ws = null, backoff = 500;

  function status(text, ok) {
    const el = document.getElementById("live-status");
    if (el) { el.textContent = text; el.dataset.ok = ok ? "1" : "0"; }
  }

  function connect() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    ws = new WebSocket(proto + "//" + location.host + "/ws/v1/stream");
    ws.onopen = () => { backoff = 500; status("live", true); Object.keys(handlers).forEach((c) => ws.send(JSON.stringify({ type: "subscribe", channel: c }))); };
    ws.onclose = () => { status("reconnecting…", false); setTimeout(connect, backoff + Math.random() * backoff); backoff = Math.min(backoff * 2, 15000); };
    ws.onmessage = (ev) => {
      const msg = JSON.parse(ev.data);
      if (msg.type === "error" && msg.code === "forbidden") { status("not updating: " + msg.message, false); return; }
      if (msg.type === "snapshot") { last[msg.channel] = msg.seq; (handlers[msg.channel] || []).forEach((h) => h(msg.data, true)); return; }
      if (msg.type !== "update") return;
      const prev = last[msg.channel];
      if (prev !== undefined && msg.seq <= prev) return; // older than the snapshot
      if (prev !== undefined && msg.seq !== prev + 1) { ws.send(JSON.stringify({ type: "subscribe", channel: msg.channel })); return; } // gap
      last[msg.channel] = msg.seq;
      (handlers[msg.channel] || []).forEach((h) => h(msg.data, false));
    };
  }

  function watch(channel, fn) { (handlers[channel] = handlers[channel] || []).push(fn); }

  // Line charts with the vendored uPlot. Until a chart has points, and without uPlot or
  // JavaScript, the server-rendered figures in its container stay as they are.
  const cssVar = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  const PALETTE = ["--accent", "--accent2", "--warn", "--ask"];
  const CHART_HEIGHT = 220;
  function lineChart(el, { yFmt, rounds = false, days = false, yRange = null, minSpan = rounds ? 4 : days ? 3 * 86400 : 120 }) {
    if (!el || !window.uPlot) return null;
    let plot = null;
    const width = () => Math.max(240, el.clientWidth);
    const axis = () => ({ stroke: cssVar("--muted"), grid: { stroke: cssVar("--line"), width: 1 }, ticks: { stroke: cssVar("--line"), width: 1 } });
    function build(data, labels) {
      const clock = days ? (v) => new Date(v * 1000).toISOString().slice(0, 10) : (v) => new Date(v * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
      const x = rounds ? { ...axis(), incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], values: (u, vals) => vals.map((v) => "#" + v) } : { ...axis(), space: 80, values: (u, vals) => vals.map(clock) };
      return new window.uPlot({
        width: width(), height: CHART_HEIGHT,
        // a few seconds of heartbeats, or one round, still get a readable axis
        // from the data itself (uPlot pads a single x by a day); a few seconds of heartbeats,
        // or one round, still get a readable axis
        scales: { x: { time: !rounds, range: (u) => { const xs = u.data[0], lo = xs[0], hi = xs[xs.length - 1]; return hi - lo < minSpan ? [hi - minSpan, hi + minSpan / 20] : [lo, hi]; } }, y: yRange ? { range: yRange } : {} },
        axes: [x, { ...axis(), size: 64, values: (u, vals) => vals.map(yFmt) }],
        series: [{ label: rounds ? "round" : days ? "day" : "time", value: (u, v) => (v === null ? "—" : rounds ? "#" + v : days ? clock(v) : stamp(new Date(v * 1000))) },
          ...labels.map((label, i) => ({ label, stroke: cssVar(PALETTE[i % PALETTE.length]), width: 2, spanGaps: true, points: { size: 5 }, value: (u, v) => (v === null ? "—" : yFmt(v)) }))],
      }, data, el);
    }
    new ResizeObserver(() => { if (plot && plot.width !== width()) plot.setSize({ width: width(), height: CHART_HEIGHT }); }).observe(el);
    return {
      set(data, labels) {
        if (!data[0].length && !plot) return; // keep the server's words ("no sales yet")
        if (plot && plot.series.length !== data.length) { plot.destroy(); plot = null; }
        if (!plot) { el.textContent = ""; el.classList.add("has-plot"); plot = build(data, labels); } else plot.setData(data);
      },
    };
  }

  // Markets: one row per bucket
  document.querySelectorAll("tr[data-bucket]").forEach((row) => {
    watch("book." + row.dataset.bucket, (d) => {
      setText(row.querySelector(".ask"), price(d.best_ask));
      setText(row.querySelector(".bid"), price(d.best_bid));
      setText(row.querySelector("[data-field=free]"), String(d.gpus_free));
      if (d.last_price !== null) setText(row.querySelector("[data-field=last]"), price(d.last_price));
    });
  });

  // Market detail: KPIs, depth bars, recent trades
  const detail = document.querySelector("[data-market]");
  if (detail) {
    const key = detail.dataset.market;
    watch("book." + key, (d) => {
      setText(document.querySelector("[data-kpi=best_ask]"), price(d.best_ask));
      setText(document.querySelector("[data-kpi=best_bid]"), price(d.best_bid));
      setText(document.querySelector("[data-kpi=gpus_free]"), String(d.gpus_free));
      if (d.last_price !== null) setText(document.querySelector("[data-kpi=last_price]"), price(d.last_price));
      const body = document.querySelector("#depth tbody");
      if (body) {
        const peak = Math.max(1, ...d.asks.map((a) => a[1]));
        let cum = 0;
        body.innerHTML = d.asks.map(([p, g]) => { cum += g; return `<tr><td class="num ask">${price(p)}</td><td class="num">${g}</td><td class="num">${cum}</td><td class="barcell"><span class="bar" style="width:${Math.round(100 * g / peak)}%"></span></td></tr>`; }).join("");
      }
    });
    const [model, region] = [key.slice(0, key.lastIndexOf(".")), key.slice(key.lastIndexOf(".") + 1)];
    watch("trades", (d, isSnapshot) => {
      if (isSnapshot || !d.trade || d.trade.gpu_model !== model || d.trade.region !== region) return;
      const body = document.querySelector("#recent-trades tbody");
      if (!body) return;
      const t = d.trade, tr = document.createElement("tr");
      tr.innerHTML = `<td data-label="Round">#${t.round}</td><td class="num" data-label="Price">${price(t.price)}</td><td class="num" data-label="GPUs">${t.gpus}</td><td class="num" data-label="Hours">${(t.duration_s / 3600).toFixed(1)} h</td><td class="reason" data-label="Why">live</td>`;
      body.prepend(tr); flash(tr);
    });
    // clearing price over time: the server's history ([unix time cleared, price]), then each
    // new round's price for this market at the time it cleared
    const history = readJSON("price-history") || [];
    const rounds = history.map((h) => h[0]), prices = history.map((h) => h[1] / 1e6), seen = new Set();
    const priceChart = lineChart(document.getElementById("price-chart"), { yFmt: (v) => v.toFixed(2) });
    const drawPrices = () => priceChart && priceChart.set([rounds, prices], ["clearing price"]);
    drawPrices();
    watch("rounds", (d, isSnapshot) => {
      if (isSnapshot || !d.round || !d.round.cleared_at) return;
      const p = (d.round.prices || []).find((x) => x.gpu_model === model && x.region === region && x.price);
      const at = Date.parse(d.round.cleared_at) / 1000;
      if (!p || seen.has(d.round.number) || (rounds.length && at <= rounds[rounds.length - 1])) return;
      seen.add(d.round.number); rounds.push(at); prices.push(p.price / 1e6);
      if (rounds.length > 100) { rounds.shift(); prices.shift(); }
      drawPrices();
      setText(document.querySelector("[data-field=history-note]"), `${rounds.length} round${rounds.length === 1 ? "" : "s"} with trades · USDC per GPU-hour`);
    });
  }

  // Rounds strip: the newest round on any page that has one
  const ticker = document.getElementById("round-ticker");
  if (ticker) {
    watch("rounds", (d, isSnapshot) => {
      const r = isSnapshot ? (d.rounds || [])[0] : d.round;
      if (!r) return;
      const priced = (r.prices || []).filter((p) => p.price).slice(0, 4).map((p) => `${p.gpu_model} ${p.region} ${price(p.price)}`).join(" · ");
      setText(ticker, `Round #${r.number}: ${r.trades} trades, ${r.matched_gpus} GPUs${priced ? " — " + priced : ""}`);
    });
  }

  // A matched order's trades and jobs are rendered by the server: fetch the page once and
  // swap in that row (no reload, so the socket and the rest of the page stay as they are)
  const refreshing = new Set();
  function refreshRow(row, id) {
    if (refreshing.has(id)) return;
    refreshing.add(id);
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
      .then((html) => {
        const fresh = new DOMParser().parseFromString(html, "text/html").querySelector(`tr[data-order="${id}"]`);
        if (fresh && fresh.querySelector("progress[data-job]")) { row.innerHTML = fresh.innerHTML; flash(row); }
      })
      .catch(() => {})
      .finally(() => setTimeout(() => refreshing.delete(id), 2000));
  }

  // A running job's page: the end of its output, live on the buyer's jobs channel
  const jobLog = document.querySelector("[data-job-live]");
  if (jobLog) {
    watch("jobs", (d, isSnapshot) => {
      const j = d.job;
      if (isSnapshot || !j || String(j.id) !== jobLog.dataset.jobLive || !j.log_tail || jobLog.textContent === j.log_tail) return;
      const atEnd = jobLog.scrollTop + jobLog.clientHeight >= jobLog.scrollHeight - 4;
      jobLog.textContent = j.log_tail;
      if (atEnd) jobLog.scrollTop = jobLog.scrollHeight;
    });
  }

  // My orders: states, explanations, job progress
  if (document.querySelector("[data-orders]")) {
    watch("orders", (d, isSnapshot) => {
      const orders = isSnapshot ? d.orders : [d.order];
      orders.forEach((o) => {
        const row = document.querySelector(`tr[data-order="${o.id}"]`);
        // a new order shows on the first page of all orders, above the newest shown; an older
        // one (another page's) and any page with a filter stay as they are
        if (!row) {
          const wrap = document.querySelector("[data-live-new]"), first = document.querySelector("tr[data-order]");
          if (!isSnapshot && wrap && (!first || o.id > Number(first.dataset.order))) location.reload();
          return;
        }
        const pill = row.querySelector(".pill");
        if (pill && pill.textContent !== o.state) { pill.textContent = o.state; pill.className = "pill state-" + o.state; flash(row); }
        const why = row.querySelector("[data-field=why]");
        if (why && (o.state === "open" || o.state === "expired") && o.explanation && o.explanation.reasons) setText(why, localStamps(o.explanation.reasons.join("; ")));
        const expiry = row.querySelector("[data-field=expires]");
        if (expiry && o.state !== "open") expiry.remove();
        if (o.state === "matched" && why && !row.dataset.matched) { row.dataset.matched = "1"; setText(why, "matched: " + ((o.explanation && o.explanation.reasons) || []).join("; ")); }
        if (o.state === "matched" && !row.querySelector("progress[data-job]")) refreshRow(row, o.id);
      });
    });
    watch("jobs", (d, isSnapshot) => {
      (isSnapshot ? d.jobs : [d.job]).forEach((j) => {
        const bar = document.querySelector(`progress[data-job="${j.id}"]`);
        if (bar) { bar.value = j.progress; const s = document.querySelector(`[data-job-state="${j.id}"]`); setText(s, j.state); }
        const pay = document.querySelector(`[data-trade-state="${j.id}"]`);
        if (pay && j.trade_state && pay.textContent !== j.trade_state) { pay.textContent = j.trade_state; pay.className = "pill state-" + j.trade_state; flash(pay); }
      });
    });
  }

  // Provider dashboard: machines (online state, heartbeats, per-GPU telemetry), sales, earnings
  const provider = document.querySelector("[data-provider-dashboard]");
  if (provider) {
    const charts = readJSON("provider-charts") || { utilisation: [], earnings: [] };
    const util = new Map(charts.utilisation.map((m) => [m.id, { name: m.name, points: m.points || [] }]));
    const utilChart = lineChart(document.getElementById("util-chart"), { yFmt: (v) => v.toFixed(0) + "%", yRange: [0, 100] });
    const drawUtil = () => {
      const ms = [...util.values()].filter((m) => m.points.length);
      const xs = [...new Set(ms.flatMap((m) => m.points.map((p) => p[0])))].sort((a, b) => a - b);
      const ys = ms.map((m) => { const at = new Map(m.points); return xs.map((x) => (at.has(x) ? at.get(x) : null)); });
      if (utilChart) utilChart.set([xs, ...ys], ms.map((m) => m.name));
    };
    const earnings = charts.earnings.slice();
    const earnChart = lineChart(document.getElementById("earnings-chart"), { yFmt: (v) => v.toLocaleString("en-US", { maximumFractionDigits: Math.abs(v) < 100 ? 2 : 0 }) + " USDC" });
    const drawEarnings = () => earnChart && earnChart.set([earnings.map((p) => p[0]), earnings.map((p) => p[1] / 1e6)], ["paid on chain, less held"]);
    drawUtil(); drawEarnings();

    const gpuCells = (m) => (m.telemetry || []).length
      ? m.telemetry.map((g) => { const u = Math.round(g.utilisation); return `<span class="gpu" title="GPU ${esc(g.index)}: ${u}% · ${Math.round(g.temperature_c)} °C · ${Math.round(g.power_w)} W"><span class="gpu-i">${esc(g.index)}</span><span class="util mini" role="img" aria-label="GPU ${esc(g.index)} ${u}% utilised"><span style="width: ${u}%"></span></span> ${u}% · ${Math.round(g.temperature_c)} °C</span>`; }).join("")
      : '<span class="muted">no telemetry yet</span>';
    const booked = (m) => `<span class="util" role="img" aria-label="${m.booked_pct}% busy"><span style="width: ${m.booked_pct}%"></span></span> ${m.busy} of ${m.gpus} GPUs`;
    function renderMachine(m) {
      let row = document.querySelector(`tr[data-machine="${m.id}"]`);
      if (!row) {
        row = document.createElement("tr");
        row.dataset.machine = m.id;
        row.innerHTML = `<td><strong>${esc(m.name)}</strong></td><td><span class="pill" data-field="state"></span></td><td data-field="heartbeat">never</td><td class="gpus-cell" data-field="telemetry"></td><td data-field="booked"></td><td>${esc(m.region_name)}</td><td class="num" data-field="reliability"></td>`;
        document.querySelector("#machines tbody").append(row);
        document.querySelector("#machines").closest(".table-wrap").hidden = false;
        const empty = document.getElementById("machines-empty"); if (empty) empty.remove();
      }
      pill(row.querySelector("[data-field=state]"), m.state);
      const hb = row.querySelector("[data-field=heartbeat]");
      if (m.last_heartbeat && hb.dataset.at !== m.last_heartbeat) { hb.dataset.at = m.last_heartbeat; hb.textContent = ago(m.last_heartbeat); flash(hb); }
      setText(row.querySelector("[data-field=reliability]"), m.reliability.toFixed(3));
      const b = row.querySelector("[data-field=booked]"), html = booked(m);
      if (b.dataset.html !== html) { b.innerHTML = html; b.dataset.html = html; }
      row.querySelector("[data-field=telemetry]").innerHTML = gpuCells(m);
      const rows = [...document.querySelectorAll("tr[data-machine]")];
      setText(document.querySelector("[data-kpi=online]"), `${rows.filter((r) => r.querySelector(".state-online")).length} / ${rows.length}`);
    }
    watch("machines", (d, isSnapshot) => {
      (isSnapshot ? d.machines : [d.machine]).forEach((m) => {
        renderMachine(m);
        const series = util.get(m.id) || { name: m.name, points: [] };
        if (isSnapshot) series.points = m.history || series.points;
        else if (m.gpu_util !== null && m.last_heartbeat) {
          const t = Date.parse(m.last_heartbeat) / 1000;
          if (!series.points.length || series.points[series.points.length - 1][0] < t) series.points = [...series.points, [t, m.gpu_util]].slice(-120);
        }
        util.set(m.id, series);
      });
      drawUtil();
    });
    setInterval(() => document.querySelectorAll("[data-field=heartbeat][data-at]").forEach((el) => { el.textContent = ago(el.dataset.at); }), 1000);

    function renderSale(t) {
      let row = document.querySelector(`tr[data-sale="${t.id}"]`);
      const fresh = !row;
      if (fresh) {
        row = document.createElement("tr");
        row.dataset.sale = t.id;
        row.innerHTML = `<td><a href="/trades/${t.id}/">#${t.id}</a></td><td>#${t.round}</td><td>${esc(t.gpu_model)} · ${esc(t.region)}</td><td class="num">${price(t.price)}</td><td class="num">${t.gpus}</td><td class="num">${money(t.amount)}</td><td class="num" data-field="paid">—</td><td><span class="pill" data-field="state"></span></td><td data-field="job">—</td>`;
        document.querySelector("#sales tbody").prepend(row);
        document.querySelector("#sales").closest(".table-wrap").hidden = false;
        const empty = document.getElementById("sales-empty"); if (empty) empty.remove();
        flash(row);
      }
      pill(row.querySelector("[data-field=state]"), t.state);
      setText(row.querySelector("[data-field=paid]"), t.paid === null || t.paid === undefined ? "—" : tokens(t.paid));
      if (t.job) {
        const cell = row.querySelector("[data-field=job]");
        if (!cell.querySelector("progress")) cell.innerHTML = '<span class="job-state"></span> <progress max="1" aria-label="job progress"></progress>';
        setText(cell.querySelector(".job-state"), t.job.state);
        cell.querySelector("progress").value = t.job.progress;
      }
      return fresh;
    }
    watch("sales", (d, isSnapshot) => {
      const totals = d.totals || {};
      ["sold", "pending", "paid", "held", "free", "stake"].forEach((k) => setText(document.querySelector(`[data-kpi=${k}]`), usdc(totals[k] || 0)));
      (isSnapshot ? d.sales.slice().reverse() : [d.sale]).forEach((t) => renderSale(t));
      // the chart follows the chain: a point when a confirmed settlement or ruling moved the earnings
      const value = (totals.paid || 0) - (totals.held || 0), lastPoint = earnings[earnings.length - 1];
      if (!isSnapshot && totals.paid !== undefined && (lastPoint ? lastPoint[1] !== value : value !== 0)) {
        const at = Date.now() / 1000;
        if (lastPoint && at - lastPoint[0] < 1) lastPoint[1] = value; else earnings.push([at, value]);
        drawEarnings();
      }
    });
    // a withdrawal or a stake top-up moves no sale: the balances channel carries them
    watch("balances", (d) => {
      const b = d.balances;
      if (!b || !b.provider_address) return;
      setText(document.querySelector("[data-kpi=free]"), usdc(b.earnings_free || 0));
      setText(document.querySelector("[data-kpi=stake]"), usdc(b.stake || 0));
    });
  }

  window.GridBidChart = { lineChart };  // the job page's own script draws with it

  // Wallet: what the buyer paid providers per day (from its statement: confirmed payments)
  const spend = readJSON("spend-data");
  if (spend && spend.length) {
    const chart = lineChart(document.getElementById("spend-chart"), { days: true, yFmt: (v) => v.toLocaleString("en-US", { maximumFractionDigits: 6 }) + " USDC" });
    if (chart) chart.set([spend.map((p) => Date.parse(p[0] + "T00:00:00Z") / 1000), spend.map((p) => p[1] / 1e6)], ["paid to providers"]);
  }

  // Operator: rounds, the settlement queue, jobs by state, machines offline
  if (document.querySelector("[data-operator-dashboard]")) {
    const seenRounds = new Set([...document.querySelectorAll("tr[data-round]")].map((r) => Number(r.dataset.round)));
    const countRows = (counts, empty) => {
      const keys = Object.keys(counts || {}).sort();
      return keys.length ? keys.map((k) => `<tr><td><span class="pill state-${esc(k)}">${esc(k)}</span></td><td class="num">${counts[k]}</td></tr>`).join("") : `<tr><td colspan="2" class="muted">${esc(empty)}</td></tr>`;
    };
    const swap = (body, html) => { if (body && body.dataset.html !== html) { body.innerHTML = html; body.dataset.html = html; flash(body); } };
    watch("operator", (d) => {
      document.querySelectorAll("tbody[data-list]").forEach((body) => swap(body, countRows(d[body.dataset.list], body.dataset.empty)));
      setText(document.querySelector("[data-field=offline_count]"), String(d.offline_count));
      const rec = d.reconciliation, recEl = document.getElementById("op-reconciliation");
      if (rec && recEl) {
        const html = rec.ok
          ? `<span class="pill state-settled">matches the chain</span> ${rec.entries} journal entries, hash chain intact, every balance equal to the contract's${rec.block ? " at block " + rec.block : ""} · checked ${esc(stamp(new Date(rec.at)))}`
          : `<span class="pill state-failed">differs from the chain</span> ${rec.problems.map((p) => "<br><code>" + esc(p) + "</code>").join("")}${rec.more ? "<br>and " + rec.more + " more" : ""}`;
        swap(recEl, html);
      }
      swap(document.querySelector("#op-offline tbody"), d.offline.length
        ? d.offline.map((m) => `<tr data-machine="${m.id}"><td>${esc(m.provider)}</td><td>${esc(m.name)}</td><td>${esc(m.region)}</td><td>${m.last_heartbeat ? ago(m.last_heartbeat) : "never seen"}</td><td class="num">${m.reliability.toFixed(3)}</td></tr>`).join("")
        : '<tr><td colspan="5" class="muted">Every machine is online.</td></tr>');
      const body = document.querySelector("#op-rounds tbody");
      if (!body) return;
      body.innerHTML = d.rounds.length ? d.rounds.map((r) => `<tr data-round="${r.number}"><td>#${r.number}</td><td><span class="pill state-${esc(r.state)}">${esc(r.state)}</span>${r.error ? ` <span class="error">${esc(r.error)}</span>` : ""}</td><td class="num">${r.bids ?? "—"}</td><td class="num">${r.trades ?? "—"}</td><td class="num">${r.clear_ms !== null && r.clear_ms !== undefined ? r.clear_ms + " ms" : "—"}</td><td class="num" data-field="skipped_slots">${r.skipped_slots ?? "—"}</td><td class="num">${r.gap ?? "—"}</td><td class="small">${esc(r.method)}</td></tr>`).join("")
        : '<tr><td colspan="8" class="muted">No rounds yet: a round runs when there is at least one open bid.</td></tr>';
      body.querySelectorAll("tr[data-round]").forEach((tr) => { const n = Number(tr.dataset.round); if (!seenRounds.has(n)) { seenRounds.add(n); flash(tr); } });
    });
  }

  // Wallet: the escrow follows confirmed chain events
  if (document.getElementById("escrow-free")) {
    watch("balances", (d) => {
      const b = d.balances;
      if (!b) return;
      const free = document.getElementById("escrow-free"), locked = document.getElementById("escrow-locked");
      if (free && free.textContent !== usdc(b.free)) { free.textContent = usdc(b.free); flash(free); }
      if (locked && locked.textContent !== usdc(b.locked)) { locked.textContent = usdc(b.locked); flash(locked); }
    });
  }

  if (Object.keys(handlers).length) connect();
  window.GridBid = { money, usdc, price, watch };
})();
