"""The import structure between the project's packages (issue 28), measured with grimp
(import-linter's graph library) and Python's own parser.

One circle held 22 modules of market, ledger and providers, and 256 imports of project
code sat inside functions, most of them dodging that circle. Issue 28 broke the circle by
moving code: no circle is allowed now, counting imports inside functions too (grimp sees
them). Outside the CLIs' lazy command loading, 17 imports wait inside functions, each with
its reason in a comment; the count may not grow. pyproject.toml's import-linter contracts
state the layers; a test here checks that every module sits in one.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = ("gridbid", "market", "ledger", "providers", "contracts", "demo")
ROOT = Path(__file__).resolve().parents[2]
# of project code, outside the command-line tools' lazy command loading (256 in all before
# issue 28's moves, 17 after them and 72 in the two CLIs)
IN_FUNCTION_IMPORTS = 17
LAZY_COMMANDS = ("providers/agent/commands/", "gridbid/cli.py")


def circles() -> list[list[str]]:
    """The import graph's strongly connected components of more than one module."""
    import grimp

    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        # iterative Tarjan: (module, its imports still to visit)
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, todo = work[-1]
            nxt = next(todo, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                elif nxt in on_stack:
                    low[module] = min(low[module], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def in_function_imports() -> list[str]:
    """`path:line` of each import of project code inside a function."""
    places: set[str] = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for function in ast.walk(tree):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(function):
                    if isinstance(node, ast.ImportFrom):
                        names = [node.module or ""] if node.level == 0 else []
                    elif isinstance(node, ast.Import):
                        names = [alias.name for alias in node.names]
                    else:
                        continue
                    if any(name.split(".")[0] in PACKAGES for name in names):
                        places.add(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sorted(places)


def test_no_import_circle() -> None:
    found = circles()
    assert not found, f"import circles (counting imports inside functions): {found}; move code so that imports go one way (issue 28)"


def _reasoned(place: str) -> bool:
    """The import says why it waits: a comment on its line, or on the line above its block."""
    path, line = place.split(":")
    lines = (ROOT / path).read_text().split("\n")
    i = int(line) - 1
    if "#" in lines[i]:
        return True
    def in_block(text: str) -> bool:  # an import line, or a name of a parenthesised one
        return not text.startswith("#") and (text.startswith(("from ", "import ")) or text.endswith((",", "(", ")")) or "# noqa" in text)

    # up through the import block to the line above it

    while i > 0 and in_block(lines[i - 1].strip()):
        i -= 1
    return lines[i - 1].strip().startswith("#")


def test_imports_inside_functions_are_few_and_say_why() -> None:
    """The command-line tools load each command's code when it runs (the agent's and
    gridbid's); elsewhere an import waits only for a stated reason."""
    places = [p for p in in_function_imports() if not p.startswith(LAZY_COMMANDS)]
    assert len(places) <= IN_FUNCTION_IMPORTS, (
        f"{len(places)} imports of project code inside functions, over {IN_FUNCTION_IMPORTS}: import at the top "
        "of the module, or move the code so that no circle needs hiding (issue 28)")
    silent = [p for p in places if not _reasoned(p)]
    assert not silent, f"imports inside functions without a one-line reason (a comment on the line or above the block): {silent}"


def test_every_module_has_a_layer() -> None:
    """The layers contract in pyproject.toml names modules one by one; a new module outside
    every layer would escape it. The engine and the agent have their own contracts."""
    import tomllib

    import grimp

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    named = {m.strip() for layer in layers for m in layer.replace("|", ":").split(":")}
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    own_contracts = ("market.engine", "providers.agent")
    loose = sorted(
        m for m in graph.modules
        if m not in PACKAGES and not m.startswith(own_contracts)
        and not any(m == n or m.startswith(n + ".") for n in named)
    )
    assert not loose, f"modules in no layer of pyproject.toml's layers contract (add each to the layer it belongs to): {loose}"
