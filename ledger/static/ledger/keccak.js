/* Keccak-256 as Ethereum uses it (the original Keccak padding 0x01, not SHA3's 0x06).
   Small and dependency-free: lanes are BigInts, which is slow but ample for a few
   Merkle proofs. Checked against eth_utils.keccak in tests/e2e/test_browser_ledger.py. */
(function (global) {
  "use strict";
  var MASK = (1n << 64n) - 1n;
  var RC = [
    0x0000000000000001n, 0x0000000000008082n, 0x800000000000808an, 0x8000000080008000n,
    0x000000000000808bn, 0x0000000080000001n, 0x8000000080008081n, 0x8000000000008009n,
    0x000000000000008an, 0x0000000000000088n, 0x0000000080008009n, 0x000000008000000an,
    0x000000008000808bn, 0x800000000000008bn, 0x8000000000008089n, 0x8000000000008003n,
    0x8000000000008002n, 0x8000000000000080n, 0x000000000000800an, 0x800000008000000an,
    0x8000000080008081n, 0x8000000000008080n, 0x0000000080000001n, 0x8000000080008008n
  ];
  // rotation offsets r[x][y]
  var R = [[0, 36, 3, 41, 18], [1, 44, 10, 45, 2], [62, 6, 43, 15, 61], [28, 55, 25, 21, 56], [27, 20, 39, 8, 14]];

  function rotl(v, n) {
    if (n === 0) return v;
    var b = BigInt(n);
    return ((v << b) | (v >> (64n - b))) & MASK;
  }

  function permute(s) {
    var C = new Array(5), D = new Array(5), B = new Array(25), x, y;
    for (var round = 0; round < 24; round++) {
      for (x = 0; x < 5; x++) C[x] = s[x] ^ s[x + 5] ^ s[x + 10] ^ s[x + 15] ^ s[x + 20];
      for (x = 0; x < 5; x++) D[x] = C[(x + 4) % 5] ^ rotl(C[(x + 1) % 5], 1);
      for (x = 0; x < 5; x++) for (y = 0; y < 5; y++) s[x + 5 * y] ^= D[x];
      for (x = 0; x < 5; x++) for (y = 0; y < 5; y++) B[y + 5 * ((2 * x + 3 * y) % 5)] = rotl(s[x + 5 * y], R[x][y]);
      for (x = 0; x < 5; x++) for (y = 0; y < 5; y++) s[x + 5 * y] = B[x + 5 * y] ^ ((~B[(x + 1) % 5 + 5 * y] & MASK) & B[(x + 2) % 5 + 5 * y]);
      s[0] ^= RC[round];
    }
  }

  /** keccak256(Uint8Array) -> Uint8Array(32) */
  function keccak256(data) {
    var rate = 136, i, j;
    var padded = new Uint8Array((Math.floor(data.length / rate) + 1) * rate);
    padded.set(data);
    padded[data.length] ^= 0x01;
    padded[padded.length - 1] ^= 0x80;
    var s = new Array(25).fill(0n);
    for (var off = 0; off < padded.length; off += rate) {
      for (i = 0; i < rate / 8; i++) {
        var lane = 0n;
        for (j = 7; j >= 0; j--) lane = (lane << 8n) | BigInt(padded[off + 8 * i + j]);
        s[i] ^= lane;
      }
      permute(s);
    }
    var out = new Uint8Array(32);
    for (i = 0; i < 4; i++) for (j = 0; j < 8; j++) out[8 * i + j] = Number((s[i] >> BigInt(8 * j)) & 0xffn);
    return out;
  }

  function fromHex(hex) {
    hex = String(hex).replace(/^0x/, "");
    if (hex.length % 2 || /[^0-9a-fA-F]/.test(hex)) throw new Error("not hex: " + hex);
    var out = new Uint8Array(hex.length / 2);
    for (var i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(2 * i, 2), 16);
    return out;
  }

  function toHex(bytes) {
    var s = "0x";
    for (var i = 0; i < bytes.length; i++) s += (bytes[i] < 16 ? "0" : "") + bytes[i].toString(16);
    return s;
  }

  var api = { keccak256: keccak256, fromHex: fromHex, toHex: toHex };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  global.GridBidKeccak = api;
})(typeof window !== "undefined" ? window : globalThis);
