"""Where a transaction's gas goes, by Vyper source line (``bench_gas.py --profile``).

Traces the transaction on the node (``debug_traceTransaction``, opcodes only),
charges each step what it really cost (the drop in gas to the next step at the
same depth, so a call is charged with everything it spent), and maps its
program counter to a source line through the compiler's source map. Calldata
and the transaction's base cost are not steps: they are the difference between
``gasUsed`` and the traced execution. The node must trace steps (anvil
``--steps-tracing``). Under ``OPTIMIZE = "codesize"`` most of the code is shared
subroutines the source map can't place: they are the "(unmapped)" row.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["line_costs", "print_profile"]


def _source_map(path: Path, optimize: str, evm_version: str) -> dict[int, tuple[int, int]]:
    """pc -> (source id, line) of the runtime code."""
    from vyper.compiler import compile_from_file_input
    from vyper.compiler.input_bundle import FilesystemInputBundle
    from vyper.compiler.settings import OptimizationLevel, Settings

    bundle = FilesystemInputBundle([path.parent])
    out = compile_from_file_input(
        bundle.load_file(path),
        input_bundle=bundle,
        settings=Settings(optimize=OptimizationLevel.from_string(optimize), evm_version=evm_version),
        output_formats=["source_map"],
    )
    sm = out["source_map"]
    ast = sm["pc_ast_map"]
    return {int(pc): (int(ast.get(pc, (0, 0))[0]), int(pos[0])) for pc, pos in sm["pc_pos_map"].items()}


def line_costs(w3: Any, tx_hash: Any, path: Path) -> tuple[Counter[tuple[int, int]], Counter[str], int]:
    """Gas per (source id, line), gas per opcode, and the gas spent outside execution."""
    from contracts.compile import EVM_VERSION, OPTIMIZE

    pcs = _source_map(path, OPTIMIZE, EVM_VERSION)
    trace = w3.provider.make_request(
        "debug_traceTransaction",
        [tx_hash.hex() if hasattr(tx_hash, "hex") else tx_hash,
         {"disableStack": True, "disableMemory": True, "disableStorage": True}],
    )
    steps = trace["result"]["structLogs"]
    by_line: Counter[tuple[int, int]] = Counter()
    by_op: Counter[str] = Counter()
    executed = 0
    following: int | None = None  # the next step at depth 1, walking backwards
    for step in reversed(steps):
        if step["depth"] != 1:
            continue
        cost = step["gas"] - following if following is not None else step["gasCost"]
        following = step["gas"]
        executed += cost
        by_line[pcs.get(step["pc"], (-1, -1))] += cost
        by_op[step["op"]] += cost
    used = int(w3.eth.get_transaction_receipt(tx_hash)["gasUsed"])
    return by_line, by_op, used - executed


def print_profile(w3: Any, tx_hash: Any, path: Path, title: str, top: int = 25) -> None:
    by_line, by_op, outside = line_costs(w3, tx_hash, path)
    lines = path.read_text().splitlines()
    total = sum(by_line.values()) + outside
    print(f"\n{title}: {total:,} gas; outside execution (base, calldata, refunds) {outside:,}")
    print("  by opcode: " + ", ".join(f"{op} {g:,}" for op, g in by_op.most_common(12)))
    for (src, line), gas in by_line.most_common(top):
        if src == 0 and 0 < line <= len(lines):
            text = lines[line - 1].strip()
        else:
            text = "(unmapped)" if line < 0 else f"(module {src}, line {line})"
        print(f"  {gas:>9,}  {line:>4}  {text[:90]}")
