"""Where the logical TP ranks of a resharding run live when they run on several devices (issue #41).

Producers take the first half of the devices, consumers the second, round-robin inside each half.
ONE PROCESS PER DEVICE hosts every logical rank placed there: the communicator's ranks are the
device processes, not the TP ranks, so NCCL's one-rank-per-GPU rule holds and TP 2→4 runs on two
GPUs. A list of one device would put producers and consumers in one process: no transfer is
shown there (:class:`CannotPlace`; applicability.py says "not applicable", never a pass). A device
listed twice (``cpu,cpu``; ``cuda:0,cuda:0`` on a one-GPU machine) is two processes on it, the bytes
crossing between them through host memory (device_transfer.engine_for).
"""

from __future__ import annotations

import dataclasses


class CannotPlace(ValueError):
    """Producers and consumers cannot be put on different devices."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """``producers[r]`` / ``consumers[r]``: the index into ``devices`` of logical rank r's process."""

    devices: tuple[str, ...]
    producers: tuple[int, ...]
    consumers: tuple[int, ...]

    def producer_ranks_on(self, index: int) -> list[int]:
        return [rank for rank, at in enumerate(self.producers) if at == index]

    def consumer_ranks_on(self, index: int) -> list[int]:
        return [rank for rank, at in enumerate(self.consumers) if at == index]

    def describe(self) -> str:
        """``cpu#0: P0 | cpu#1: C0 C1``: which logical ranks each device process hosts."""
        parts = [f"{device}#{i}: " + " ".join([*(f"P{r}" for r in self.producer_ranks_on(i)), *(f"C{r}" for r in self.consumer_ranks_on(i))])
                 for i, device in enumerate(self.devices)]
        return " | ".join(parts)


def refusal(devices) -> str | None:
    """Why no transfer between devices can run on ``devices``, or None."""
    if len(devices) < 2:
        return f"needs two devices, has {len(devices)} ({', '.join(devices) or 'none'})"
    return None


def place(producer_tp: int, consumer_tp: int, devices) -> Placement:
    """Producer ranks round-robin over ``devices[:half]``, consumer ranks over ``devices[half:]``
    (``half = len // 2``): no device process hosts both a producer and a consumer."""
    devices = tuple(devices)
    why = refusal(devices)
    if why:
        raise CannotPlace(why)
    half = len(devices) // 2
    return Placement(devices, tuple(r % half for r in range(producer_tp)),
                     tuple(half + r % (len(devices) - half) for r in range(consumer_tp)))
