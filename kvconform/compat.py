"""``kvconform.compat``: the KV-connector handshake check a connector imports at run time, and
the ``kvconform compat`` command. The code lives beside the reference it is built on
(``kvconform.reference.compat``); this module is the public surface.
"""

from __future__ import annotations

import argparse
import sys

from kvconform.reference.compat import (  # noqa: F401 - the public surface
    SCHEMA, DescriptorError, Endpoint, Plan, Verdict, check, check_group, check_ranks, convert_wire, describe, describe_latent,
    describe_quant, engine_limits, execute, load, parse, value_ratio,
)
from kvconform.reference.compat_caches import LatentEndpoint, LatentPlan, QuantEndpoint, QuantPlan  # noqa: F401


# ----------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """``python -m kvconform.compat PRODUCER.json CONSUMER.json``: exit 0 compatible, 1 not, 2 unreadable."""
    parser = argparse.ArgumentParser(prog="python -m kvconform.compat", description="KV-connector handshake check between two layout descriptors")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser) -> None:
    parser.add_argument("producer", help="descriptor JSON of the producer (one object, or a list: one per TP rank)")
    parser.add_argument("consumer", help="descriptor JSON of the consumer (one object, or a list: one per TP rank)")


def run(args) -> int:
    """Every descriptor is validated first (``load``); an unusable file exits 2 naming it. Text from
    the files (a label, a path) is made printable: an ESC in a descriptor never reaches the terminal."""
    from kvconform.reports.terminal import printable  # the command's only: a connector importing compat needs no rich

    try:
        producers, consumers = load(args.producer, role="producer"), load(args.consumer, role="consumer")
        verdicts = [[check(p, c) for p in producers] for c in consumers]
    except DescriptorError as exc:
        print(printable(f"kvconform compat: {exc}"), file=sys.stderr)
        return 2
    ok = True
    for consumer, row in zip(consumers, verdicts):
        print(printable(f"consumer rank {consumer_text(parse(consumer))}:"))
        for producer, verdict in zip(producers, row):
            p = parse(producer)
            head = f"  from producer rank {p.tp_rank} of {p.tp_size} ({p.label}): "
            print(printable(head + str(verdict).replace("\n", "\n  ")))
            ok &= verdict.compatible
    return 0 if ok else 1


def consumer_text(c: Endpoint | LatentEndpoint | QuantEndpoint) -> str:
    """``0 of 2 (label, what it stores, block N, its heads)``: the heading of a consumer rank."""
    if isinstance(c, LatentEndpoint):
        return f"{c.tp_rank} of {c.tp_size} ({c.label}, {c.geometry.fmt.label()}, block {c.geometry.block_size}, the latent replicated)"
    stored = f"{c.geometry.mode} {c.geometry.order}" if isinstance(c, QuantEndpoint) else str(c.geometry.dtype).removeprefix("torch.")
    return (f"{c.tp_rank} of {c.tp_size} ({c.label}, {stored}, block {c.geometry.block_size}, "
            f"model heads {c.heads.start}..{c.heads.stop - 1} of {c.total_kv_heads})")


if __name__ == "__main__":
    sys.exit(main())
