"""The approximate prefix index: which servers hold which block hashes, as the router's own dispatches
(and, optionally, replies) say; it never sees a server's real cache, it models it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class PrefixIndex:
    """Which servers hold which block hashes: ``hash → servers`` plus one LRU of hashes per server.

    Evicting a hash from a server's LRU removes the server from that hash's holders. Each server has a slot
    number and a hash's holders are a bitmask of slots (an int), so the walk in ``match`` is integer ANDs and
    the index holds no per-hash containers for the garbage collector to scan. Not thread-safe.
    """

    __slots__ = ("_free_slots", "_holders", "_lrus", "_server_of_slot", "_slot_of")

    def __init__(self) -> None:
        self._holders: dict[int, int] = {}  # block hash → bitmask of server slots
        self._lrus: dict[str, OrderedDict[int, None]] = {}
        self._slot_of: dict[str, int] = {}
        self._server_of_slot: dict[int, str] = {}
        self._free_slots: list[int] = []

    def __len__(self) -> int:
        """Total (server, hash) entries."""
        return sum(len(lru) for lru in self._lrus.values())

    @property
    def servers(self) -> list[str]:
        return list(self._lrus)

    @property
    def distinct_blocks(self) -> int:
        """Block hashes held by at least one server."""
        return len(self._holders)

    def server_size(self, server: str) -> int:
        lru = self._lrus.get(server)
        return 0 if lru is None else len(lru)

    def holders(self, block_hash: int) -> frozenset[str]:
        return frozenset(self._servers_in(self._holders.get(block_hash, 0)))

    def insert(self, server: str, hashes: list[int], capacity: int) -> None:
        """Record that ``server`` holds ``hashes``, then evict its least recently used beyond ``capacity``.

        The leading blocks go in last, so they are the most recently used (see the module docstring).
        """
        lru = self._lrus.get(server)
        if lru is None:
            lru = self._lrus[server] = OrderedDict()
            slot = self._free_slots.pop() if self._free_slots else len(self._slot_of)
            self._slot_of[server] = slot
            self._server_of_slot[slot] = server
        bit = 1 << self._slot_of[server]
        holders = self._holders
        for block_hash in reversed(hashes):
            if block_hash in lru:
                lru.move_to_end(block_hash)
            else:
                lru[block_hash] = None
                holders[block_hash] = holders.get(block_hash, 0) | bit
        for _ in range(len(lru) - max(capacity, 1)):
            evicted, _ = lru.popitem(last=False)
            self._forget(evicted, bit)

    def match(self, hashes: list[int]) -> dict[str, int]:
        """Per server, how many leading blocks of ``hashes`` it holds (servers holding none are absent)."""
        if not hashes:
            return {}
        holders = self._holders
        alive = holders.get(hashes[0], 0)
        if not alive:
            return {}
        matched: dict[str, int] = {}
        depth = 1
        for block_hash in hashes[1:]:
            survivors = alive & holders.get(block_hash, 0)
            if survivors != alive:
                for server in self._servers_in(alive & ~survivors):
                    matched[server] = depth
                if not survivors:
                    return matched
                alive = survivors
            depth += 1
        for server in self._servers_in(alive):
            matched[server] = depth
        return matched

    def remove_server(self, server: str) -> None:
        lru = self._lrus.pop(server, None)
        if lru is None:
            return
        slot = self._slot_of.pop(server)
        del self._server_of_slot[slot]
        bit = 1 << slot
        for block_hash in lru:
            self._forget(block_hash, bit)
        self._free_slots.append(slot)

    def retain_servers(self, keep: Iterable[str]) -> list[str]:
        """Drop every server not in ``keep``; returns the dropped ones."""
        keep_set = set(keep)
        dropped = [server for server in self._lrus if server not in keep_set]
        for server in dropped:
            self.remove_server(server)
        return dropped

    def _servers_in(self, mask: int) -> list[str]:
        server_of_slot = self._server_of_slot
        servers = []
        while mask:
            lowest = mask & -mask
            servers.append(server_of_slot[lowest.bit_length() - 1])
            mask ^= lowest
        return servers

    def _forget(self, block_hash: int, bit: int) -> None:
        mask = self._holders.get(block_hash, 0) & ~bit
        if mask:
            self._holders[block_hash] = mask
        else:
            self._holders.pop(block_hash, None)
