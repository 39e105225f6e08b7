"""The published conformance kit: how anyone proves a store or a runtime honours runfold's contract.

For now it only exports `strategies`, the hypothesis strategies for runtime authors (commands,
valid and invalid histories, snapshots, events). The store checks (`StoreConformance`,
`StoreStateMachine`, `run_conformance`) come later.
"""

from runfold.conformance import strategies

__all__ = ["strategies"]
