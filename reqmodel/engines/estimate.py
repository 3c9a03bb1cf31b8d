"""How many states an exhaustive search of a scenario will hold, before it
starts: from the scenario's size (``scenario.size``) and the measured state
counts of the built-in scenarios (``sizes.json``, written by
``python tools/size_data.py --write``; a test checks it against the
explorations of the current model).

The fit is log10(states) = a + b * size over the built-ins (each at its
largest release); the band is the widest the measured counts stray from
the fit, so every built-in lies inside it. It is wide (static settings do
not tell how requests and events interleave): an answer to "a second, a
minute or a day?", and a refusal before any work only when even the band's
low end is more than the search may hold (``--max-states``, or what fits
in the machine's memory): the exhaustive engine's size guard (``refusal``)."""
from __future__ import annotations

import json
import math
import os
from importlib import resources
from typing import Dict, List, Optional, Tuple

import attrs

from reqmodel.model.scenario import Scenario, size

# measured without the networkx graph and with --fingerprints, the largest
# of three scenarios (notes/performance.md, "A fingerprint mode and memory
# per state": 667-773 and 180-264 bytes a state), rounded up
BYTES_PER_STATE = 780
BYTES_PER_FINGERPRINT = 270


def memory_bytes() -> int:
    """What this machine has for a search: MemAvailable (Linux), else the
    physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 40


def refusal(sc: Scenario, max_states: int, fingerprints: bool = False) -> Optional[str]:
    """Why an exhaustive search of ``sc`` is refused before it starts, or
    None: only when even the estimate's low end holds more states than
    --max-states, or than fit in this machine's memory."""
    est = estimate(sc)
    per = BYTES_PER_FINGERPRINT if fingerprints else BYTES_PER_STATE
    available = memory_bytes()
    fit = available // per
    if est.low <= min(max_states, fit):
        return None
    what = (f"more than --max-states {max_states:,}" if max_states <= fit else
            f"more than fit in this machine's {available / 2 ** 30:.1f} GB available "
            f"({per} bytes a state)")
    return f"{est.describe()}, {what} even at the low end"


def measured() -> List[Dict]:
    """The recorded counts: per built-in scenario, its size and the most
    distinct states over the releases (every property, exhausted)."""
    return json.loads(resources.files("reqmodel.engines").joinpath("sizes.json").read_text())


def fit(rows: List[Dict]) -> Tuple[float, float, float]:
    """(a, b, band) of log10(states) = a + b * size, least squares; band:
    the largest distance of a measured count from the fit, in log10."""
    xs = [r["size"] for r in rows]
    ys = [math.log10(r["states"]) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    band = max(abs(y - (a + b * x)) for x, y in zip(xs, ys))
    return a, b, band


@attrs.frozen
class Estimate:
    size: int
    low: int  # states, the band's low end
    mid: int
    high: int

    @property
    def factor(self) -> float:
        return self.high / self.mid

    def describe(self) -> str:
        return (f"estimated {_n(self.low)} to {_n(self.high)} distinct states "
                f"(size {self.size}; about {_mb(self.high)} at most)")


def estimate(sc: Scenario) -> Estimate:
    a, b, band = _FIT
    w = size(sc)
    mid = a + b * w
    return Estimate(w, int(10 ** (mid - band)), int(10 ** mid), int(10 ** (mid + band)))


def _n(x: int) -> str:
    """A count written whole up to a million (``186,066``), in words beyond
    (``3.2 billion``): no unit that one end of a range could seem to share."""
    for unit, div in (("quadrillion", 1e15), ("trillion", 1e12), ("billion", 1e9),
                      ("million", 1e6)):
        if x >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:,}"


def _mb(states: int) -> str:
    mb = states * BYTES_PER_STATE / 2 ** 20
    if mb >= 2 ** 20:
        return f"{mb / 2 ** 20:,.0f} TB"
    return f"{mb / 1024:.3g} GB" if mb >= 1024 else f"{max(1, round(mb))} MB"


_FIT = fit(measured())
