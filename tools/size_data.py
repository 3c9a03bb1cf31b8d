"""Record the built-in scenarios' state counts for the exhaustive engine's
size estimate (reqmodel/engines/sizes.json): per scenario its size and the
most distinct states over the releases, every property, exhausted.

    python tools/size_data.py           # print the table
    python tools/size_data.py --write   # and write reqmodel/engines/sizes.json
"""
import json
import pathlib
import sys

from reqmodel.engines import estimate
from reqmodel.engines.exhaustive import explore
from reqmodel.model import properties, releases, scenario

OUT = pathlib.Path(__file__).resolve().parent.parent / "reqmodel" / "engines" / "sizes.json"


def rows():
    props = properties.select([])
    for name in scenario.builtin_names():
        sc = scenario.builtin(name)
        states = max(explore(rel, sc, props, stop_early=False, keep_graph=False).states
                     for rel in releases.RELEASES.values())
        yield {"scenario": name, "size": scenario.size(sc), "states": states}


def main() -> None:
    data = list(rows())
    a, b, band = estimate.fit(data)
    for r in data:
        print(f"{r['scenario']:24} size {r['size']:3} states {r['states']:9,}")
    print(f"log10(states) = {a:.3f} + {b:.3f} * size, band +-{band:.2f} "
          f"(a factor of {10 ** band:.0f})")
    if "--write" in sys.argv:
        OUT.write_text(json.dumps(data, indent=0) + "\n")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
