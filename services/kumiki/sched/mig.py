"""MIG (Multi-Instance GPU) profiles and the placements NVIDIA allows for them.

A MIG GPU has 8 memory slices; a GPU instance of a profile occupies a contiguous run of them and
may only start at the offsets `nvidia-smi mig -lgipp` lists. Modelling occupancy as an 8-bit mask
makes "never two instances on one slice" and "only valid layouts" one bitwise check each.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

MIG_SLOTS = 8


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile: compute slices (of 7), memory slices (of 8), allowed start slots."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_gb: float
    starts: tuple[int, ...]

    def mask(self, start: int) -> int:
        return ((1 << self.memory_slices) - 1) << start


def _profiles(memory_unit_gb: float, suffix: str = "gb") -> dict[str, MigProfile]:
    def name(compute: int, memory: int) -> str:
        return f"{compute}g.{int(memory * memory_unit_gb)}{suffix}"

    return {
        name(1, 1): MigProfile(name(1, 1), 1, 1, memory_unit_gb, (0, 1, 2, 3, 4, 5, 6)),
        name(1, 2): MigProfile(name(1, 2), 1, 2, 2 * memory_unit_gb, (0, 2, 4, 6)),
        name(2, 2): MigProfile(name(2, 2), 2, 2, 2 * memory_unit_gb, (0, 2, 4)),
        name(3, 4): MigProfile(name(3, 4), 3, 4, 4 * memory_unit_gb, (0, 4)),
        name(4, 4): MigProfile(name(4, 4), 4, 4, 4 * memory_unit_gb, (0,)),
        name(7, 8): MigProfile(name(7, 8), 7, 8, 8 * memory_unit_gb, (0,)),
    }


# GPU model -> its MIG profiles. A100-40GB has 5 GB slices, A100-80GB/H100-80GB 10 GB slices.
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _profiles(5.0),
    "A100-80GB": _profiles(10.0),
    "H100-80GB": _profiles(10.0),
    "H100-94GB": _profiles(12.0),
    "H200-141GB": _profiles(18.0),
}
# A100-40GB has no 1g.10gb profile (1 compute, 2 memory slices); the others have the 1g double-memory one.
del MIG_PROFILES["A100-40GB"]["1g.10gb"]


class MigError(ValueError):
    """A MIG profile or layout that the GPU model does not support."""


def profile_for(gpu_model: str, profile: str) -> MigProfile:
    profiles = MIG_PROFILES.get(gpu_model)
    if profiles is None:
        raise MigError(f"GPU model {gpu_model!r} does not support MIG (known: {', '.join(MIG_PROFILES)})")
    found = profiles.get(profile)
    if found is None:
        raise MigError(f"MIG profile {profile!r} is not valid on {gpu_model} (valid: {', '.join(profiles)})")
    return found


def free_starts(occupied: int, profile: MigProfile) -> list[int]:
    """Start slots where `profile` fits next to the instances already in `occupied`."""
    return [start for start in profile.starts if not occupied & profile.mask(start)]


def validate_layout(gpu_model: str, layout: list[tuple[str, int]]) -> int:
    """Check a whole layout [(profile, start)]; returns its occupancy mask or raises MigError."""
    occupied = 0
    compute = 0
    for name, start in layout:
        profile = profile_for(gpu_model, name)
        if start not in profile.starts:
            raise MigError(f"{name} cannot start at slot {start} on {gpu_model} (allowed: {profile.starts})")
        mask = profile.mask(start)
        if occupied & mask:
            raise MigError(f"{name} at slot {start} overlaps another instance")
        occupied |= mask
        compute += profile.compute_slices
    if compute > 7:
        raise MigError(f"layout uses {compute} compute slices, the GPU has 7")
    return occupied


def usable_capacity(gpu_model: str, occupied: int, mix: dict[str, float]) -> float:
    """Expected number of instances of the request mix that still fit: the fragmentation measure for MIG.

    For each profile in the mix, count how many more instances could be packed greedily from the
    lowest slot; weight by the mix's share. Higher means less fragmentation. Memoised: a placement
    scores every free slot of every MIG GPU, and occupancy masks repeat across a fleet.
    """
    return _usable_capacity(gpu_model, occupied, tuple(sorted(mix.items())))


@lru_cache(maxsize=65536)
def _usable_capacity(gpu_model: str, occupied: int, mix: tuple[tuple[str, float], ...]) -> float:
    total = 0.0
    for name, weight in mix:
        profile = profile_for(gpu_model, name)
        mask = occupied
        count = 0
        for start in profile.starts:
            if not mask & profile.mask(start):
                mask |= profile.mask(start)
                count += 1
        total += weight * count * profile.compute_slices
    return total
