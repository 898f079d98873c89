/* Browser wallets (EIP-1193, window.ethereum): say whether one is present, link it to the
   account with a signed one-time message, deposit from it, and sign each bid's EIP-712
   order in it, and send its disputes. Without a wallet, orders are signed by the custodial key and none of this
   shows. Every request goes to our own API with the session and its CSRF token. */
(function () {
  "use strict";

  function csrf() {
    const m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    const input = document.querySelector("[name=csrfmiddlewaretoken]");
    return m ? decodeURIComponent(m[1]) : (input ? input.value : "");
  }

  async function api(method, url, body) {
    const r = await fetch(url, {
      method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf(), "Accept": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error((data.error && data.error.message) || `the server answered ${r.status}`);
    return data;
  }

  function say(text, ok) {
    const el = document.getElementById("wallet-message");
    if (!el) return;
    el.hidden = false;
    el.textContent = text;
    el.className = "quote " + (ok ? "ok" : "no");
  }

  function walletError(e) {
    if (e && e.code === 4001) return "You declined in your wallet; nothing was changed.";
    return (e && e.message) || String(e);
  }

  // hex-encoded UTF-8: what every wallet accepts for personal_sign (MetaMask, geth, anvil)
  const utf8Hex = (text) => "0x" + Array.from(new TextEncoder().encode(text), (b) => b.toString(16).padStart(2, "0")).join("");
  const hex32 = (n) => BigInt(n).toString(16).padStart(64, "0");
  const addr32 = (a) => a.toLowerCase().replace(/^0x/, "").padStart(64, "0");

  async function waitMined(hash) {
    for (let i = 0; i < 120; i++) {
      const receipt = await window.ethereum.request({ method: "eth_getTransactionReceipt", params: [hash] });
      if (receipt) {
        if (receipt.status !== "0x1") throw new Error(`transaction ${hash} reverted`);
        return receipt;
      }
      await new Promise((res) => setTimeout(res, 1000));
    }
    throw new Error(`transaction ${hash} was not mined in two minutes`);
  }

  function presence() {
    const el = document.getElementById("browser-wallet");
    if (!el) return;
    if (window.ethereum) {
      const name = window.ethereum.isMetaMask ? "MetaMask" : "A browser wallet";
      el.textContent = name + " is available in this browser: orders can be signed there (EIP-712) instead of by your custodial key.";
      el.setAttribute("data-wallet", "present");
    } else {
      el.textContent = "No browser wallet found: your orders are signed by your custodial key, kept encrypted by GridBid.";
      el.setAttribute("data-wallet", "absent");
    }
  }

  function linkButton() {
    const button = document.getElementById("wallet-link");
    if (!button || !window.ethereum) return;
    button.hidden = false;
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const [account] = await window.ethereum.request({ method: "eth_requestAccounts" });
        const { message } = await api("POST", "/api/v1/me/wallet/challenge/");
        const signature = await window.ethereum.request({ method: "personal_sign", params: [utf8Hex(message), account] });
        await api("POST", "/api/v1/me/wallet/", { address: account, message, signature });
        location.reload();
      } catch (e) {
        say("The wallet was not linked: " + walletError(e), false);
        button.disabled = false;
      }
    });
  }

  function depositForm() {
    const form = document.getElementById("wallet-deposit-form");
    if (!form) return;
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      if (!window.ethereum) { say("No browser wallet here: open this page where your wallet is installed.", false); return; }
      // typed in USDC ("12.50"); the chain counts base units (6 decimals)
      const m = form.amount.value.trim().match(/^(\d+)(?:\.(\d{1,6}))?$/);
      const amount = m ? (BigInt(m[1]) * 1000000n + BigInt((m[2] || "").padEnd(6, "0"))).toString() : "0";
      if (amount === "0") { say("Type the amount in USDC, more than 0, like 12.50.", false); return; }
      const from = form.dataset.account, d = form.dataset;
      try {
        say("Approve the token in your wallet…", true);
        const approve = await window.ethereum.request({ method: "eth_sendTransaction", params: [{ from, to: d.token, data: d.approve + addr32(d.market) + hex32(amount) }] });
        await waitMined(approve);
        say("Now confirm the deposit in your wallet…", true);
        const deposit = await window.ethereum.request({ method: "eth_sendTransaction", params: [{ from, to: d.market, data: d.deposit + hex32(amount) }] });
        await waitMined(deposit);
        say(`Deposit sent (${deposit}); it shows here once the chain confirms it.`, true);
        form.reset();
      } catch (e) {
        say("The deposit did not go through: " + walletError(e), false);
      }
    });
  }

  // Rows of "My orders" are swapped in place when a round matches them (app.js), possibly
  // while the wallet is open: so clicks are taken on the document, not on one button, and
  // once an order is signed every copy of its button, now or swapped in later, says so.
  const signedOrders = new Set();
  function markSigned(root) {
    root.querySelectorAll("[data-sign-order]").forEach((button) => {
      const id = button.dataset.signOrder;
      if (!signedOrders.has(id)) return;
      const done = document.createElement("span");
      done.className = "small muted";
      done.dataset.signed = id;
      done.textContent = "order signed ✓";
      button.replaceWith(done);
    });
  }

  async function signOrder(button) {
    const id = button.dataset.signOrder;
    if (!window.ethereum) { button.textContent = "no browser wallet here"; return; }
    button.disabled = true;
    try {
      const { typed_data, spec_message } = await api("GET", `/api/v1/bids/${id}/order/`);
      const signature = await window.ethereum.request({ method: "eth_signTypedData_v4", params: [button.dataset.account, JSON.stringify(typed_data)] });
      // and the job spec, so the provider's agent knows the buyer wrote it
      const spec_signature = await window.ethereum.request({ method: "personal_sign", params: [utf8Hex(spec_message), button.dataset.account] });
      await api("POST", `/api/v1/bids/${id}/order/sign/`, { signature, spec_signature });
      signedOrders.add(id);
      markSigned(document);
    } catch (e) {
      document.querySelectorAll(`[data-sign-order="${id}"]`).forEach((b) => {
        b.disabled = false;
        b.textContent = "sign order in wallet (" + walletError(e) + ")";
      });
    }
  }

  function orderButtons() {
    document.addEventListener("click", (ev) => {
      const button = ev.target.closest && ev.target.closest("[data-sign-order]");
      if (button && !button.disabled) signOrder(button);
    });
    new MutationObserver(() => { if (signedOrders.size) markSigned(document); })
      .observe(document.body, { childList: true, subtree: true });
  }

  // a wallet buyer's dispute: the server builds the call (trade, receipt, both Merkle
  // proofs), the wallet sends it; the page follows the trade once the chain confirms it
  function disputeButtons() {
    document.querySelectorAll("[data-dispute-trade]").forEach((button) => {
      button.addEventListener("click", async () => {
        if (!window.ethereum) { say("No browser wallet in this browser: your escrow is your wallet's, dispute from it.", false); return; }
        button.disabled = true;
        try {
          const answer = await api("POST", `/api/v1/ledger/trades/${button.dataset.disputeTrade}/dispute/`);
          const { from, to, data } = answer.call;
          const hash = await window.ethereum.request({ method: "eth_sendTransaction", params: [{ from, to, data }] });
          // sent: the page says pending, not the old state with the same button
          button.hidden = true;
          say(`Dispute pending: sent from your wallet (${hash.slice(0, 10)}…); waiting for the chain…`, true);
          await waitMined(hash);
          say("Dispute sent and mined: what this trade paid is held for the arbiter once the chain confirms it.", true);
          setTimeout(() => location.reload(), 4000);
        } catch (e) {
          button.disabled = false;
          say("The dispute did not go through: " + walletError(e), false);
        }
      });
    });
  }

  function start() {
    presence(); linkButton(); depositForm(); orderButtons(); disputeButtons();
    document.documentElement.dataset.walletReady = "yes";  // the buttons answer from here on
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
