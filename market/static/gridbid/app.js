// GridBid live updates: one WebSocket, pages declare what they watch.
// Pages work without this script; it only keeps them fresh (see docs/stream.md).
(function () {
  "use strict";
  const money = (v) => (v === null || v === undefined) ? "—" : (v / 1e6).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  const flash = (el) => { if (!el) return; el.classList.remove("flash"); void el.offsetWidth; el.classList.add("flash"); };
  const setText = (el, text) => { if (el && el.textContent !== text) { el.textContent = text; flash(el); } };
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

  // Markets: one row per bucket
  document.querySelectorAll("tr[data-bucket]").forEach((row) => {
    watch("book." + row.dataset.bucket, (d) => {
      setText(row.querySelector(".ask"), money(d.best_ask));
      setText(row.querySelector(".bid"), money(d.best_bid));
      setText(row.querySelector("[data-field=free]"), String(d.gpus_free));
      if (d.last_price !== null) setText(row.querySelector("[data-field=last]"), money(d.last_price));
    });
  });

  // Market detail: KPIs, depth bars, recent trades
  const detail = document.querySelector("[data-market]");
  if (detail) {
    const key = detail.dataset.market;
    watch("book." + key, (d) => {
      setText(document.querySelector("[data-kpi=best_ask]"), money(d.best_ask));
      setText(document.querySelector("[data-kpi=best_bid]"), money(d.best_bid));
      setText(document.querySelector("[data-kpi=gpus_free]"), String(d.gpus_free));
      if (d.last_price !== null) setText(document.querySelector("[data-kpi=last_price]"), money(d.last_price));
      const body = document.querySelector("#depth tbody");
      if (body) {
        const peak = Math.max(1, ...d.asks.map((a) => a[1]));
        let cum = 0;
        body.innerHTML = d.asks.map(([p, g]) => { cum += g; return `<tr><td class="num ask">${money(p)}</td><td class="num">${g}</td><td class="num">${cum}</td><td class="barcell"><span class="bar" style="width:${Math.round(100 * g / peak)}%"></span></td></tr>`; }).join("");
      }
    });
    const [model, region] = [key.slice(0, key.lastIndexOf(".")), key.slice(key.lastIndexOf(".") + 1)];
    watch("trades", (d, isSnapshot) => {
      if (isSnapshot || !d.trade || d.trade.gpu_model !== model || d.trade.region !== region) return;
      const body = document.querySelector("#recent-trades tbody");
      if (!body) return;
      const t = d.trade, tr = document.createElement("tr");
      tr.innerHTML = `<td>#${t.round}</td><td class="num">${money(t.price)}</td><td class="num">${t.gpus}</td><td class="num">${(t.duration_s / 3600).toFixed(1)} h</td><td class="reason">live</td>`;
      body.prepend(tr); flash(tr);
    });
  }

  // Rounds strip: the newest round on any page that has one
  const ticker = document.getElementById("round-ticker");
  if (ticker) {
    watch("rounds", (d, isSnapshot) => {
      const r = isSnapshot ? (d.rounds || [])[0] : d.round;
      if (!r) return;
      const priced = (r.prices || []).filter((p) => p.price).slice(0, 4).map((p) => `${p.gpu_model} ${p.region} ${money(p.price)}`).join(" · ");
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

  // My orders: states, explanations, job progress
  if (document.querySelector("[data-orders]")) {
    watch("orders", (d, isSnapshot) => {
      const orders = isSnapshot ? d.orders : [d.order];
      orders.forEach((o) => {
        const row = document.querySelector(`tr[data-order="${o.id}"]`);
        if (!row) { if (!isSnapshot) location.reload(); return; }
        const pill = row.querySelector(".pill");
        if (pill && pill.textContent !== o.state) { pill.textContent = o.state; pill.className = "pill state-" + o.state; flash(row); }
        const why = row.querySelector("[data-field=why]");
        if (why && o.state === "open" && o.explanation && o.explanation.reasons) setText(why, o.explanation.reasons.join("; "));
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

  if (Object.keys(handlers).length) connect();
  window.GridBid = { money, watch };
})();
