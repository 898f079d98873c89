/* Verifies a trade's receipt proof in the browser, as contracts/merkle.py defines it:
   leaf = keccak256(0x00 || uint256 trade || uint256 gpu_seconds || bytes32 digest),
   node = keccak256(0x01 || left || right), left/right by the bits of the index. */
(function () {
  "use strict";
  var K = window.GridBidKeccak;

  function uint256(n) {
    var v = BigInt(n), out = new Uint8Array(32);
    for (var i = 31; i >= 0; i--) { out[i] = Number(v & 0xffn); v >>= 8n; }
    return out;
  }

  function concat() {
    var total = 0, i;
    for (i = 0; i < arguments.length; i++) total += arguments[i].length;
    var out = new Uint8Array(total), off = 0;
    for (i = 0; i < arguments.length; i++) { out.set(arguments[i], off); off += arguments[i].length; }
    return out;
  }

  function receiptLeaf(trade, gpuSeconds, digest) {
    return K.keccak256(concat(new Uint8Array([0]), uint256(trade), uint256(gpuSeconds), K.fromHex(digest)));
  }

  /** {ok, leaf, computedRoot, reason} */
  function verify(d) {
    var leaf = receiptLeaf(d.trade, d.gpu_seconds, d.digest);
    if (d.leaf && K.toHex(leaf) !== d.leaf.toLowerCase()) {
      return { ok: false, leaf: K.toHex(leaf), reason: "the receipt's leaf recomputed here (" + K.toHex(leaf) + ") is not the one listed (" + d.leaf + ")" };
    }
    var index = BigInt(d.index);
    if (index < 0n || (index >> BigInt(d.proof.length)) !== 0n) return { ok: false, leaf: K.toHex(leaf), reason: "index " + d.index + " does not fit a proof of " + d.proof.length + " nodes" };
    var node = leaf, one = new Uint8Array([1]);
    for (var i = 0; i < d.proof.length; i++) {
      var sib = K.fromHex(d.proof[i]);
      node = (index & 1n) ? K.keccak256(concat(one, sib, node)) : K.keccak256(concat(one, node, sib));
      index >>= 1n;
    }
    var computed = K.toHex(node);
    if (computed !== d.root.toLowerCase()) return { ok: false, leaf: K.toHex(leaf), computedRoot: computed, reason: "the proof folds to " + computed + ", not the settlement root " + d.root };
    return { ok: true, leaf: K.toHex(leaf), computedRoot: computed };
  }

  window.GridBidProof = { verify: verify, receiptLeaf: receiptLeaf };

  document.addEventListener("DOMContentLoaded", function () {
    var el = document.getElementById("proof-data"), out = document.getElementById("proof-status");
    if (!el || !out) return;
    var result;
    try { result = verify(JSON.parse(el.textContent)); } catch (e) { result = { ok: false, reason: "could not check the proof: " + e.message }; }
    out.textContent = result.ok ? "proof verified ✓" : "proof NOT verified: " + result.reason;
    out.className = "quote " + (result.ok ? "ok" : "no");
    out.setAttribute("data-verified", result.ok ? "true" : "false");
    var computed = document.getElementById("proof-computed-root");
    if (computed && result.computedRoot) computed.textContent = result.computedRoot;
  });
})();
