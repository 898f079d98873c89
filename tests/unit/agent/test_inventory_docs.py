"""docs/agent.md documents the declared inventory file: its examples load through the real
loader, and the validation errors it lists are the loader's own words."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from providers.agent.inventory import InventoryError, declared_inventory, load_declared

DOC = Path(__file__).resolve().parents[3] / "docs" / "agent.md"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("## The inventory file")
    return text[start:text.index("\n## ", start + 1)]


def _example(lang: str) -> str:
    found = re.search(rf"```{lang}\n(.*?)```", _section(), re.S)
    assert found, f"docs/agent.md shows no {lang} inventory example"
    return found.group(1)


def test_the_documented_toml_example_loads_with_its_models_memory_and_links(tmp_path: Path) -> None:
    path = tmp_path / "inventory.toml"
    path.write_text(_example("toml"))
    inv = load_declared(path)
    assert inv.source == "declared" and (inv.driver_version, inv.cuda_version) == ("550.54.15", "12.4")
    assert [(g.index, g.model, g.memory_mib) for g in inv.gpus] == [(0, "H100-SXM-80GB", 81559), (1, "H100-SXM-80GB", 80 * 1024)]
    assert inv.gpus[0].uuid == "GPU-5b8f1c2e-0a4d-4c1e-9d7a-3f2b1a0c9e11" and inv.gpus[1].uuid.startswith("GPU-")
    assert inv.gpus[0].simulate == {"idle_utilisation": 0.0, "busy_utilisation": 97.0}
    assert inv.links == {"0-1": "nvlink"} and inv.interconnect == "nvlink"


def test_the_documented_json_example_loads_and_matches_by_name(tmp_path: Path) -> None:
    path = tmp_path / "inventory.json"
    path.write_text(_example("json"))
    inv = load_declared(path)
    assert [g.model for g in inv.gpus] == ["H100-SXM-80GB", "L4-24GB"]
    assert inv.interconnect == "pcie"


GOOD: dict[str, Any] = {"gpus": [{"index": 0, "name": "NVIDIA L4", "memory_mib": 23034}]}


@pytest.mark.parametrize("raw,words", [
    ([1, 2], "the inventory must be a TOML table or a JSON object with a 'gpus' list"),
    ({"gpus": []}, "'gpus' must be a non-empty list"),
    ({"gpus": [{"memory_mib": 1}]}, "gpus[N] needs a 'name'"),
    ({"gpus": [{"name": "NVIDIA L4", "memory_mib": 24.5}]}, "gpus[N] has a bad index or memory_mib"),
    ({"gpus": [{"name": "NVIDIA L4", "index": True, "memory_mib": 23034}]}, "gpus[N] has a bad index or memory_mib"),
    ({"gpus": [{"name": "Mystery GPU"}]}, "gpus[N] needs memory_mib (or a catalogue model)"),
    ({"gpus": [{"name": "NVIDIA L4", "memory_mib": 23034, "simulate": {"busy_utilisation": "high"}}]}, "gpus[N].simulate must map names to numbers"),
    ({"gpus": [{"name": "NVIDIA L4", "memory_mib": 23034, "model": "L5"}]}, "is not a catalogue model id"),
    ({"gpus": [*GOOD["gpus"], {"index": 0, "name": "NVIDIA L4", "memory_mib": 23034}]}, "GPU indexes and uuids must be unique"),
    ({**GOOD, "links": [{"a": 0, "b": 7}]}, "links[N] needs 'a' and 'b', the indexes of two declared GPUs"),
    ({**GOOD, "links": [{"a": "zero"}]}, "links[N] needs 'a' and 'b', the indexes of two declared GPUs"),
])
def test_each_documented_validation_error_is_what_the_loader_says(raw: Any, words: str) -> None:
    with pytest.raises(InventoryError) as err:
        declared_inventory(raw, source="FILE")
    said = re.sub(r"\[\d+\]", "[N]", str(err.value))
    assert words in said, said
    assert words in _section(), f"docs/agent.md does not list {words!r}"


def test_a_file_that_is_not_toml_or_json_names_the_format(tmp_path: Path) -> None:
    bad = tmp_path / "inv.toml"
    bad.write_text("gpus = [")
    with pytest.raises(InventoryError, match="is not valid TOML"):
        load_declared(bad)
    bad_json = tmp_path / "inv.json"
    bad_json.write_text(json.dumps(GOOD)[:-1])
    with pytest.raises(InventoryError, match="is not valid JSON"):
        load_declared(bad_json)
