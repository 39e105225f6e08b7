"""The kit passes a good store with every capability it documents as optional declared absent
(`--without CAPABILITY`): `MemoryStore`, and the store the certify-a-store tutorial writes. A
check that needs the capability is reported "not offered"; every other check still passes."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import attrs
import pytest

from runfold.conformance import CHECKS, Capabilities, StoreConformance, run_conformance
from runfold.stores import MemoryStore
from tests.docs.test_docs_tutorials import STORE_MODULE, _store_source


def _tutorial_module(folder: Path) -> ModuleType:
    path = folder / f"{STORE_MODULE}.py"
    path.write_text(_store_source())
    spec = importlib.util.spec_from_file_location(STORE_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tutorial_store(tmp_path_factory: pytest.TempPathFactory) -> type[StoreConformance]:
    suite: type[StoreConformance] = _tutorial_module(
        tmp_path_factory.mktemp("tutorial")
    ).TestDictStore
    return suite


CAPABILITIES = [field.name for field in attrs.fields(Capabilities)]
"""Every capability `--without` may name."""


@pytest.mark.parametrize("capability", CAPABILITIES)
@pytest.mark.parametrize("store", ["MemoryStore", "tutorial"])
def test_the_kit_passes_a_good_store_without_each_capability(
    store: str, capability: str, tutorial_store: type[StoreConformance]
) -> None:
    if store == "MemoryStore":
        target: type[StoreConformance] | type[MemoryStore] = MemoryStore
        offered = Capabilities()
    else:
        target, offered = tutorial_store, tutorial_store.capabilities
    without = attrs.evolve(offered, **{capability: False})
    report = run_conformance(target, examples=3, capabilities=without, shrink=False)
    assert report.ok, str(report)
    not_offered = {r.name for r in report.results if r.outcome == "not offered"}
    needing = {c.name for c in CHECKS if capability in c.requires}
    assert needing <= not_offered
