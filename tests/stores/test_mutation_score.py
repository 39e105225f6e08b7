"""The mutation tool behind `make mutation` makes real mutants and judges them by the kit."""

from __future__ import annotations

import ast

from benchmarks.mutation import TARGET, equivalent_keys, mutants, run_one


def test_at_least_a_hundred_distinct_mutants_that_each_compile() -> None:
    found = mutants()
    original = ast.unparse(ast.parse(TARGET.read_text()))
    assert len(found) >= 100
    assert len({m.key for m in found}) == len(found), "two mutants share a key"
    for mutant in found:
        assert mutant.source != original, mutant.key
        compile(mutant.source, str(TARGET), "exec")


def test_a_mutant_is_killed_by_the_check_that_covers_it() -> None:
    # Descending correlation reads below sequence 1 return everything instead of nothing.
    [mutant] = [m for m in mutants() if m.key == "MemoryStore._select: 0 -> 1 #1"]
    assert "after <= 1 or r.sequence < after" in mutant.source
    outcome = run_one(mutant.source, examples=2)
    assert outcome["killed_by"] == "test_read_by_correlation_scoped_to_run", outcome


def test_the_unmutated_store_survives_and_every_listed_equivalent_is_a_mutant() -> None:
    assert run_one(TARGET.read_text(), examples=2)["killed_by"] is None
    keys = {m.key for m in mutants()}
    assert set(equivalent_keys()) <= keys, set(equivalent_keys()) - keys
