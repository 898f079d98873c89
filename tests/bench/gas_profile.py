"""Where a transaction's gas goes, by Vyper source line (``bench_gas.py --profile``).

Traces the transaction on the node (``debug_traceTransaction``, opcodes only),
charges each step what it really cost (the drop in gas to the next step at the
same depth, so a call is charged with everything it spent), and maps its
program counter to a source line through the compiler's source map. Calldata
and the transaction's base cost are not steps: they are the difference between
``gasUsed`` and the traced execution. The node must trace steps (anvil
``--steps-tracing``).

Under ``OPTIMIZE = "codesize"`` the compiler merges identical code tails, so a
program counter may be shared by many lines, and the source map names just one
of them (it charged a batch's 40 buyer-balance writes to ``self.arbiter =
arbiter`` in ``set_arbiter``, which a settlement never runs); other shared
subroutines it can't place at all. So a step is charged to its own line only
when that line is in a function the transaction can run (the external
function its selector names and the internal functions it calls, transitively,
read from the AST) or in an imported module; any other step is shared code and
is charged to the line that ran last before it (the line that jumped into the
shared code), and the header says how much gas was placed that way.
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


def _reachable_lines(path: Path, selector: bytes) -> set[int]:
    """Lines of the main source that a call with `selector` can run: its external
    function and every internal function it calls, transitively."""
    import vyper.ast as vy_ast
    from eth_utils import function_abi_to_4byte_selector

    from contracts.compile import compile_contract

    module = vy_ast.parse_to_ast(path.read_text())
    functions = {f.name: f for f in module.body if isinstance(f, vy_ast.nodes.FunctionDef)}
    abi = compile_contract(path)["abi"]
    entry = next((f["name"] for f in abi if f.get("type") == "function"
                  and function_abi_to_4byte_selector(f) == selector), None)
    todo, seen = [entry] if entry in functions else [], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for call in functions[name].get_descendants(vy_ast.nodes.Call):
            fn = call.func
            if isinstance(fn, vy_ast.nodes.Attribute) and isinstance(fn.value, vy_ast.nodes.Name) \
                    and fn.value.id == "self" and fn.attr in functions:
                todo.append(fn.attr)
    return {line for name in seen for line in range(functions[name].lineno, functions[name].end_lineno + 1)}


def line_costs(w3: Any, tx_hash: Any, path: Path) -> tuple[Counter[tuple[int, int]], Counter[str], int, int]:
    """Gas per (source id, line), gas per opcode, the gas spent outside execution, and
    the part of the per-line gas that ran in shared code and went to its caller's line."""
    from contracts.compile import EVM_VERSION, OPTIMIZE

    pcs = _source_map(path, OPTIMIZE, EVM_VERSION)
    reachable = _reachable_lines(path, bytes(w3.eth.get_transaction(tx_hash)["input"][:4]))
    trace = w3.provider.make_request(
        "debug_traceTransaction",
        [tx_hash.hex() if hasattr(tx_hash, "hex") else tx_hash,
         {"disableStack": True, "disableMemory": True, "disableStorage": True}],
    )
    steps = [step for step in trace["result"]["structLogs"] if step["depth"] == 1]
    costs = [0] * len(steps)
    following: int | None = None  # the next step at depth 1, walking backwards
    for i in range(len(steps) - 1, -1, -1):
        costs[i] = steps[i]["gas"] - following if following is not None else steps[i]["gasCost"]
        following = steps[i]["gas"]
    by_line: Counter[tuple[int, int]] = Counter()
    by_op: Counter[str] = Counter()
    shared = 0
    caller = (-1, -1)  # the last line that ran, for shared code
    for step, cost in zip(steps, costs, strict=True):
        place = pcs.get(step["pc"], (-1, -1))
        if place[0] > 0 or (place[0] == 0 and place[1] in reachable):
            caller = place
        else:
            place = caller
            shared += cost
        by_line[place] += cost
        by_op[step["op"]] += cost
    used = int(w3.eth.get_transaction_receipt(tx_hash)["gasUsed"])
    return by_line, by_op, used - sum(costs), shared


def print_profile(w3: Any, tx_hash: Any, path: Path, title: str, top: int = 25) -> None:
    by_line, by_op, outside, shared = line_costs(w3, tx_hash, path)
    lines = path.read_text().splitlines()
    total = sum(by_line.values()) + outside
    print(f"\n{title}: {total:,} gas; outside execution (base, calldata, refunds) {outside:,}; "
          f"shared code charged to the line that called it {shared:,}")
    print("  by opcode: " + ", ".join(f"{op} {g:,}" for op, g in by_op.most_common(12)))
    for (src, line), gas in by_line.most_common(top):
        if src == 0 and 0 < line <= len(lines):
            text = lines[line - 1].strip()
        else:
            text = "(unmapped)" if line < 0 else f"(module {src}, line {line})"
        print(f"  {gas:>9,}  {line:>4}  {text[:90]}")
