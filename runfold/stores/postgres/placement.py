"""Which worker of a Citus cluster holds a run: PostgreSQL's `hashtext`, and the shard map.

Citus places a row by the hash of its distribution column, `hashtext(run_id)` for runfold's text
keys (collation "C"): each shard holds a range of those 32-bit hashes, each shard lives on a
node. `Placement` holds the shards of `runs` and the node group of each, read once when the store
opens, and answers `group(run_id)` in the client: the writer's group commits take the appends
of one worker only, so a group commit is never a two-phase commit across workers.

A shard moved since the store opened (rebalancing) makes the map stale: appends stay right (the
cluster routes each statement), only a group commit may span two workers until the store is
opened again.
"""

from __future__ import annotations

import bisect
import functools

from runfold.stores.postgres.connections import Connection

__all__ = ["Placement", "hashtext"]

_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = ((a - c) & _MASK) ^ _rot(c, 4)
    c = (c + b) & _MASK
    b = ((b - a) & _MASK) ^ _rot(a, 6)
    a = (a + c) & _MASK
    c = ((c - b) & _MASK) ^ _rot(b, 8)
    b = (b + a) & _MASK
    a = ((a - c) & _MASK) ^ _rot(c, 16)
    c = (c + b) & _MASK
    b = ((b - a) & _MASK) ^ _rot(a, 19)
    a = (a + c) & _MASK
    c = ((c - b) & _MASK) ^ _rot(b, 4)
    b = (b + a) & _MASK
    return a, b, c


def _final(a: int, b: int, c: int) -> int:
    c = ((c ^ b) - _rot(b, 14)) & _MASK
    a = ((a ^ c) - _rot(c, 11)) & _MASK
    b = ((b ^ a) - _rot(a, 25)) & _MASK
    c = ((c ^ b) - _rot(b, 16)) & _MASK
    a = ((a ^ c) - _rot(c, 4)) & _MASK
    b = ((b ^ a) - _rot(a, 14)) & _MASK
    return ((c ^ b) - _rot(b, 24)) & _MASK


def hashtext(text: str) -> int:
    """PostgreSQL's `hashtext(text)`, as the signed 32-bit integer the server gives.

    That is its `hash_bytes` (Bob Jenkins' lookup3, on a little-endian server) of `text` in
    UTF-8."""
    data = text.encode()
    length = len(data)
    a = b = c = (0x9E3779B9 + length + 3923095) & _MASK
    offset = 0
    while length - offset >= 12:
        a = (a + int.from_bytes(data[offset : offset + 4], "little")) & _MASK
        b = (b + int.from_bytes(data[offset + 4 : offset + 8], "little")) & _MASK
        c = (c + int.from_bytes(data[offset + 8 : offset + 12], "little")) & _MASK
        a, b, c = _mix(a, b, c)
        offset += 12
    rest = data[offset:]
    # The last 0-11 bytes: into a, b, then c from its second byte (its lowest is the length's).
    a = (a + int.from_bytes(rest[0:4], "little")) & _MASK
    b = (b + int.from_bytes(rest[4:8], "little")) & _MASK
    c = (c + (int.from_bytes(rest[8:11], "little") << 8)) & _MASK
    value = _final(a, b, c)
    return value - (1 << 32) if value >= 1 << 31 else value


class Placement:
    """The node group of each shard of a distributed `runs` table, by hash range."""

    def __init__(self, bounds: list[int], groups: list[int]) -> None:
        """Shards sorted by their lowest hash (`bounds`), with the group holding each."""
        self._bounds = bounds
        self._groups = groups
        self.group = functools.lru_cache(maxsize=1 << 16)(self._group)
        """The node group holding a run's rows (`run_id`): remembered for the last 65,536."""

    @classmethod
    async def read(cls, conn: Connection, s: str) -> Placement:
        """The shard map of `{s}.runs`, from the coordinator's metadata."""
        cursor = await conn.execute(
            "SELECT shardminvalue::integer, min(p.groupid) FROM pg_dist_shard d "
            "JOIN pg_dist_placement p USING (shardid) WHERE d.logicalrelid = to_regclass(%s) "
            "GROUP BY 1 ORDER BY 1",
            (f"{s}.runs",),
        )
        rows = await cursor.fetchall()
        return cls([int(row[0]) for row in rows], [int(row[1]) for row in rows])

    @property
    def workers(self) -> int:
        """How many node groups hold shards."""
        return len(set(self._groups))

    def _group(self, run_id: str) -> int:
        if not self._bounds:
            return 0
        at = bisect.bisect_right(self._bounds, hashtext(run_id)) - 1
        return self._groups[max(at, 0)]
