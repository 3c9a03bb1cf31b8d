"""Decode's pools as preallocation sees them: which free KV pages and
metadata slots ``d_prealloc`` (and ``d_resume``) may take, one representative
per class of indistinguishable ones, the pages the prealloc budget keeps
back for retracted requests, and the scheduler's gate that stops both queues
while a request waits retracted."""
from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

from reqmodel.model.state import DStage, State


def page_choices(s: State, need: int) -> Iterable[Tuple[int, ...]]:
    """Every way to take ``need`` free pages, one representative per ordered
    sequence of page *signatures*: free pages with the same last writer that
    no stale destination or in-flight metadata names are indistinguishable."""
    free = s.free_d_pages()
    if len(free) < need:
        return ()
    refs: Dict[int, list] = {p: [] for p in free}
    for r, room in enumerate(s.rooms):
        for i, p in enumerate(room.dst or ()):
            if p in refs:
                refs[p].append(("dst", r, i))
    for m in s.net:
        if m.kind == "metadata":
            for i, p in enumerate(m.pages):
                if p in refs:
                    refs[p].append(("msg", m.rid, i))
    classes: Dict[Tuple, List[int]] = {}
    for p in free:
        classes.setdefault((tuple((w is None, w or 0) for w in s.d_pages[p].writers),
                            tuple(refs[p])), []).append(p)
    keys = sorted(classes)

    def build(prefix: Tuple[int, ...], used: Dict[Tuple, int]):
        if len(prefix) == need:
            yield prefix
            return
        for k in keys:
            i = used.get(k, 0)
            if i < len(classes[k]):
                used[k] = i + 1
                yield from build(prefix + (classes[k][i],), used)
                used[k] = i
    # lazy: the count grows factorially with distinct page classes, and the
    # Hypothesis engine samples from a bounded prefix of it
    return build((), {})


def slot_choices(s: State) -> Tuple[int, ...]:
    """One free metadata slot per class of indistinguishable ones.  Decode's
    allocator hands out slots in the order they were freed (a deque,
    ``ReqToMetadataIdxAllocator`` ut 19:270-290) and nothing resets a slot at
    allocation, so a slot a late aux write dirtied after its free is handed
    out as it is; the model lets any free slot come next."""
    free = [i for i, sl in enumerate(s.d_slots) if sl.owner is None]
    refs: Dict[int, list] = {i: [] for i in free}
    for r, room in enumerate(s.rooms):
        if room.dst_slot in refs:
            refs[room.dst_slot].append(("dst", r))
    for m in s.net:
        if m.kind == "metadata" and m.slot in refs:
            refs[m.slot].append(("msg", m.rid, m.rank))
    seen: Dict[Tuple, int] = {}
    for i in free:
        sl = s.d_slots[i]
        seen.setdefault((repr((sl.room, sl.checksum, sl.covered_pages)), tuple(refs[i])), i)
    return tuple(sorted(seen.values()))


def retracted_reserve(s: State) -> int:
    """Pages the prealloc budget keeps for retracted requests:
    ``_allocatable_token_budgets(count_retracted=True)`` subtracts each
    retracted request's full requirement from the free pool (dc 19:1669-1671,
    20:1719, 21:1955, 22:2061, 23:2132) although a retracted request holds no
    pages (``d_resume`` takes them back).  Found by the ``decode_prealloc``
    seam: the model let a request in while a retracted one waited.  On the
    scheduler loop the model follows, its return (``processes.retracted_queue``)
    keeps ``pop_preallocated`` from running while any request is retracted, so
    this is 0 whenever ``d_prealloc`` is enabled; it is the budget's reading
    of the code, which the pipeline-parallel loop (not modelled) reaches."""
    return sum(d.origin_pages for d in s.d if d.stage is DStage.RETRACTED)
