"""Compile the Vyper contracts into ``contracts/build/<Name>.json`` ({abi, bytecode}).

CamelCase ``.vy`` files are deployable contracts and get an artifact;
snake_case ``.vy`` files are modules imported by them. Artifacts are cached by
a hash of every Vyper source they could import plus the compiler version, so
``load_artifact`` compiles at most once per change. ``contracts/build/`` is
git-ignored: ABIs and bytecode always come from this step.

    python -m contracts.compile          # compile everything, print what changed
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

CONTRACTS_DIR = Path(__file__).resolve().parent
BUILD_DIR = CONTRACTS_DIR / "build"
VYPER_VERSION = "0.4.3"
EVM_VERSION = "prague"
# GridBidMarket sits near the EIP-170 size limit (24,576 bytes): optimise for size
OPTIMIZE = "codesize"

__all__ = ["BUILD_DIR", "CONTRACTS_DIR", "compile_all", "compile_contract", "load_artifact"]


def _is_deployable(path: Path) -> bool:
    return path.suffix == ".vy" and path.stem[:1].isupper()


def _source_hash(path: Path, search_paths: list[Path]) -> str:
    digest = hashlib.sha256(f"vyper {VYPER_VERSION} {EVM_VERSION} {OPTIMIZE}\n".encode())
    digest.update(path.read_bytes())
    for directory in search_paths:
        for source in sorted(directory.glob("*.vy*")):
            digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def _check_compiler() -> None:
    import vyper

    if not vyper.__version__.startswith(VYPER_VERSION):
        raise RuntimeError(f"contracts need vyper {VYPER_VERSION}, found {vyper.__version__}")


def compile_contract(
    path: Path, *, search_paths: list[Path] | None = None, build_dir: Path = BUILD_DIR
) -> dict[str, Any]:
    """Compile one deployable ``.vy`` (modules resolved next to it and in
    ``search_paths``), caching the artifact in ``build_dir``."""
    path = Path(path).resolve()
    paths = [path.parent, *(search_paths or []), CONTRACTS_DIR]
    paths = list(dict.fromkeys(p.resolve() for p in paths))
    source_hash = _source_hash(path, paths)
    artifact_path = build_dir / f"{path.stem}.json"
    if artifact_path.exists():
        try:
            cached = json.loads(artifact_path.read_text())
            if cached.get("source_hash") == source_hash:
                return dict(cached)
        except (OSError, ValueError):
            pass

    _check_compiler()
    from vyper.compiler import compile_from_file_input
    from vyper.compiler.input_bundle import FilesystemInputBundle
    from vyper.compiler.settings import OptimizationLevel, Settings

    bundle = FilesystemInputBundle(paths)
    file_input = bundle.load_file(path)
    out = compile_from_file_input(
        file_input,
        input_bundle=bundle,
        settings=Settings(optimize=OptimizationLevel.from_string(OPTIMIZE), evm_version=EVM_VERSION),
        output_formats=["abi", "bytecode", "bytecode_runtime"],
    )
    artifact = {
        "contractName": path.stem,
        "abi": out["abi"],
        "bytecode": out["bytecode"],
        "deployedBytecode": out["bytecode_runtime"],
        "compiler": f"vyper-{VYPER_VERSION}",
        "evmVersion": EVM_VERSION,
        "source_hash": source_hash,
    }
    build_dir.mkdir(parents=True, exist_ok=True)
    # write atomically: tests and the dev chain may compile concurrently
    fd, tmp = tempfile.mkstemp(dir=build_dir, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(artifact, handle, indent=1)
    os.replace(tmp, artifact_path)
    return artifact


def compile_all(build_dir: Path = BUILD_DIR) -> dict[str, dict[str, Any]]:
    return {
        path.stem: compile_contract(path, build_dir=build_dir)
        for path in sorted(CONTRACTS_DIR.glob("*.vy"))
        if _is_deployable(path)
    }


def load_artifact(name: str) -> dict[str, Any]:
    """The {abi, bytecode, ...} artifact of ``contracts/<name>.vy``, compiled if stale."""
    path = CONTRACTS_DIR / f"{name}.vy"
    if not path.exists() or not _is_deployable(path):
        raise FileNotFoundError(f"no deployable contract {name!r} in {CONTRACTS_DIR}")
    return compile_contract(path)


def main() -> None:
    for name, artifact in compile_all().items():
        size = (len(artifact["deployedBytecode"]) - 2) // 2
        print(f"{name:24} {size:6} bytes runtime")


if __name__ == "__main__":
    main()
