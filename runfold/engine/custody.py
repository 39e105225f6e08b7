"""`Custody`: a drive's hold on its run for a worker of a fleet.

With a lease (a `Worker` set one on the engine), a drive claims its run before it decides on it:
the claim goes in the drive's first append, and every append acts as that claim's owner, so a
worker that lost the run records nothing. When the run waits, the drive releases it in the
append that makes it wait, and another worker resumes it when it is due. Without a lease a
drive owns nothing: a single process drives its runs unowned.
"""

from __future__ import annotations

from runfold.engine.journal import Journal
from runfold.engine.lease import Lease
from runfold.kernel import ClaimRun, ReleaseRun

__all__ = ["Custody"]


class Custody:
    """Claims and releases one run on a journal, for the worker holding `lease`."""

    __slots__ = ("displacing", "journal", "lease")

    def __init__(self, journal: Journal, lease: Lease, displacing: str | None) -> None:
        self.journal = journal
        self.lease = lease
        self.displacing = displacing  # the lapsed owner the claim may take the run from

    def own(self) -> None:
        """Make the run the worker's own before deciding on it (its claim is pending).

        A run the view shows owned by the worker under the claim the drive acts on needs
        nothing; one it owns under an earlier claim of this process is adopted; a free one is
        claimed, and one whose owner the drive was sent to displace is taken over.

        Raises:
            RunOwned: Another worker owns the run.
        """
        journal = self.journal
        owner = journal.snapshot.owner
        if owner is not None and owner.owner_id == self.lease.worker_id:
            journal.acting_as = owner
            return
        journal.acting_as = None
        journal.propose(ClaimRun(owner_id=self.lease.worker_id, displacing=self.displacing))
        journal.acting_as = journal.snapshot.owner

    def let_go(self) -> None:
        """The run waits: release it with what is pending (another worker resumes it when due).

        A claim of a free run that is all that is pending is dropped instead: nothing happened,
        so nothing is written. A claim that displaced a lapsed owner is written with its release,
        or the run would stay the dead owner's orphan. The drive keeps acting as the owner until
        what is pending is appended, so that append is fenced like every other; a run that
        another drive of this engine is running a step of stays claimed: that drive releases it.
        """
        journal = self.journal
        view = journal.snapshot
        if journal.acting_as is None or not view.is_live:
            return
        if any(journal.elsewhere(step_id) for step_id in view.live_step_ids):
            return
        durable = journal.durable
        free = durable is None or durable.owner is None
        if free and len(journal.pending) == 1 and isinstance(journal.pending[0], ClaimRun):
            journal.discard()
            journal.acting_as = None
        else:
            journal.propose(ReleaseRun(owner_id=journal.acting_as.owner_id))
