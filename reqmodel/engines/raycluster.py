"""The parallel exhaustive search on a Ray cluster (``check --ray ADDRESS``).

The search is ``engines.parallel``'s, round for round: the same shards
(``parallel._Shard``: a hash-partitioned visited set, its part of the
frontier and its first hits), the same coordinator (``parallel.resume``),
so the answer is the one-process answer, trace for trace.  Only where the
shards live differs: each is a Ray actor, and a round is three waves of
actor calls whose results go from actor to actor through the object store
without passing the driver:

1. ``expand``: every shard expands its frontier and returns one message per
   shard (each successor goes to the shard its hash names);
2. ``forms``: every shard takes the messages addressed to it, canonicalises
   what it does not hold and returns one message per owner of a form;
3. ``resolve``: every shard takes those and returns the tags of its new
   states to the driver, which numbers them (as ``parallel``'s coordinator
   does) and hands the ids back (``assign``).

Messages between two actors go through ``parallel._Codec``, one per
channel, in the order they were packed: Ray runs one caller's calls on an
actor in submission order, and each wave waits for the one before.

Actors must map a state to the same shard, and Python's ``hash`` is no
such map across processes that were not forked from one another (on 3.11
``hash(None)`` is the object's address, and strings hash with a per-process
seed): shards are placed by ``StableKey``, and every process of the job
runs with one ``PYTHONHASHSEED`` anyway (the job's ``runtime_env``).  The
package is shipped to the cluster (``py_modules``), so the workers run
this code.
Ray is an optional extra (``pip install 'reqmodel[ray]'``)."""
from __future__ import annotations

import operator
import os
import pickle
import resource
import socket
import zlib
from typing import Dict, List, Optional, Tuple

from reqmodel import usercode
from reqmodel.engines import parallel
from reqmodel.engines.base import EngineInputError
from reqmodel.model.state import State

HASH_SEED = "0"  # every process of a --ray job hashes with this seed


class RayUnavailable(EngineInputError):
    """Ray is not installed, or the cluster cannot be reached: one line."""


def connect(address: str):
    """Join the Ray cluster at ``address`` (``local`` starts one on this
    machine, ``auto`` finds a running one; otherwise a GCS ``host:port`` or
    a ``ray://`` client address), once per process; the ``ray`` module."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray: pip install 'reqmodel[ray]'") from None
    _reachable(address)
    if not ray.is_initialized():
        import reqmodel
        env = {"env_vars": {"PYTHONHASHSEED": HASH_SEED},
               "py_modules": [os.path.dirname(reqmodel.__file__)]}
        try:
            ray.init(address=None if address == "local" else address, runtime_env=env,
                     include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RayUnavailable(f"--ray {address}: cannot join the cluster ({first})") from None
    return ray


def _reachable(address: str, seconds: float = 5.0) -> None:
    """A ``host:port`` (or ``ray://host:port``) that no one answers is one
    line now, not Ray's minutes of retries."""
    if address in ("local", "auto"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        raise RayUnavailable(f"--ray {address}: expected local, auto, HOST:PORT or "
                             "ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as exc:
        raise RayUnavailable(f"--ray {address}: no Ray cluster answers there "
                             f"({exc.strerror or exc})") from None


def cluster_cpus(address: str) -> int:
    """The CPUs the cluster at ``address`` offers (the default worker count)."""
    ray = connect(address)
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class StableKey:
    """A state's place key, the same in every process: each field's value
    (a tuple of records) is named by the CRC-32 of its ``repr``, memoised
    per value (a successor shares most fields with its parent, so most
    look-ups hit), and the key is the hash of those integers (integers
    hash to themselves in every process).  Each field has a memo of its own:
    ``(False, False) == (0, 0)``, and one shared memo would name
    ``room_slots`` by ``aborted_by_client``'s repr in one process and not in
    another."""

    def __init__(self) -> None:
        self.memos: Tuple[Dict[object, int], ...] = tuple({} for _ in parallel._FIELDS)
        self.fields = operator.attrgetter(*parallel._FIELDS)

    def __call__(self, s: State) -> int:
        out = []
        for memo, v in zip(self.memos, self.fields(s)):
            k = memo.get(v)
            if k is None:
                k = memo[v] = zlib.crc32(repr(v).encode())
            out.append(k)
        return hash(tuple(out))


class Node:
    """One shard as a Ray actor: the shard and its channels' codecs."""

    def __init__(self, shard: "parallel._Shard", k: int, n: int, measure: bool = False):
        self.shard, self.k, self.n = shard, k, n
        shard.place = StableKey()
        shard.keep_part(k, n)
        self.send = [parallel._Codec() for _ in range(n)]
        self.recv = [parallel._Codec(shard.intern.table) for _ in range(n)]
        self.own: List[tuple] = []
        # bytes this shard sent to others, pickled (only when measured: the
        # object store pickles them again)
        self.measure, self.sent_bytes, self.sent_states = measure, 0, 0

    def _pack(self, out: List[list]) -> tuple:
        self.own = out[self.k]
        msgs = tuple(None if o == self.k else self.send[o].pack(out[o]) for o in range(self.n))
        if self.measure:
            self.sent_bytes += sum(len(pickle.dumps(m, protocol=5)) for m in msgs if m)
            self.sent_states += sum(len(out[o]) for o in range(self.n) if o != self.k)
        return msgs if self.n > 1 else msgs[0]

    def _unpack(self, msgs: tuple) -> List[list]:
        return [self.own if src == self.k else self.recv[src].unpack(m)
                for src, m in enumerate(msgs)]

    def expand(self):
        return self._pack(self.shard.expand())

    def forms(self, *msgs):
        return self._pack(self.shard.forms(self._unpack(msgs)))

    def resolve(self, *msgs) -> Tuple[List[int], List[str]]:
        return self.shard.resolve(self._unpack(msgs)), list(self.shard.found)

    def assign(self, vids: List[int]) -> None:
        self.shard.assign(vids)

    def result(self) -> tuple:
        return self.shard.result()

    def states(self, wanted: Optional[set]) -> List[Tuple[int, State]]:
        return self.shard.states(wanted)

    def usage(self) -> Dict[str, int]:
        """What this actor cost: its peak resident memory, the states it
        holds and what it sent (``measure``)."""
        return {"peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "states": len(self.shard.ids), "sent_bytes": self.sent_bytes,
                "sent_states": self.sent_states}


class Actors:
    """The shards as Ray actors, for ``parallel.resume`` (the interface of
    ``parallel._Processes``)."""

    def __init__(self, address: str, measure: bool = False):
        self.ray = connect(address)
        self.measure = measure
        self.usage: List[Dict[str, int]] = []  # each actor's (``Node.usage``), when measured

    def __call__(self, shard: "parallel._Shard", workers: int) -> "Actors":
        ray = self.ray
        # one CPU an actor, or a share when there are more actors than CPUs
        # (an actor waiting for a CPU would wait for ever)
        cpus = max(1.0, float(ray.cluster_resources().get("CPU", 1)))
        remote = ray.remote(num_cpus=min(1.0, cpus / workers))(Node)
        ref = ray.put(shard)
        self.n = workers
        self.actors = [remote.remote(ref, k, workers, self.measure) for k in range(workers)]
        return self

    def _get(self, refs):
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, usercode.UserCodeError):
                raise usercode.UserCodeError(str(cause)) from None
            raise RuntimeError(f"a Ray exploration worker failed:\n{exc}") from None

    def _wave(self, method: str, inputs=None) -> list:
        """Call ``method`` on every actor, actor k taking message k of every
        actor's last wave; each call's n results, as references."""
        n, out = self.n, []
        for k, a in enumerate(self.actors):
            args = () if inputs is None else [
                inputs[src][k] if n > 1 else inputs[src] for src in range(n)]
            out.append(getattr(a, method).options(num_returns=n).remote(*args))
        return out

    def round(self) -> List[Tuple[List[int], List[str]]]:
        forms = self._wave("forms", self._wave("expand"))
        n = self.n
        return self._get([a.resolve.remote(*[forms[src][k] if n > 1 else forms[src]
                                             for src in range(n)])
                          for k, a in enumerate(self.actors)])

    def ids(self, vids: List[List[int]], final: bool) -> None:
        self._get([a.assign.remote(v) for a, v in zip(self.actors, vids)])

    def results(self) -> list:
        return self._get([a.result.remote() for a in self.actors])

    def states(self, wanted: Optional[set]) -> Dict[int, State]:
        got: Dict[int, State] = {}
        for part in self._get([a.states.remote(wanted) for a in self.actors]):
            got.update(part)
        if self.measure:
            self.usage = self._get([a.usage.remote() for a in self.actors])
        return got

    def kill(self) -> None:
        self.close()

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
