/* Says whether a browser wallet (EIP-1193, window.ethereum) is present. Orders are signed
   by the custodial key unless the user links a wallet; this only detects and tells. */
(function () {
  "use strict";
  function show() {
    var el = document.getElementById("browser-wallet");
    if (!el) return;
    if (window.ethereum) {
      var name = window.ethereum.isMetaMask ? "MetaMask" : "A browser wallet";
      el.textContent = name + " is available in this browser: orders can be signed there (EIP-712) instead of by your custodial key.";
      el.setAttribute("data-wallet", "present");
    } else {
      el.textContent = "No browser wallet found: your orders are signed by your custodial key, kept encrypted by GridBid.";
      el.setAttribute("data-wallet", "absent");
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", show); else show();
})();
