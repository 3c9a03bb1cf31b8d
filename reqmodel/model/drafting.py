"""Copying the state's frozen records with changes, fast: a copy function
per record class generated from its attrs fields, and the drafting of the one
new ``State`` an action's effect builds (notes/performance.md).  The records
themselves are ``model.state``'s; this is how the explorer makes millions of
them."""
from __future__ import annotations

from typing import Dict, Tuple

import attrs

_REPLACERS: Dict[type, object] = {}


def _replacer(cls):
    """A copy-with-changes function for one class, generated from its attrs
    fields (notes/performance.md; the explorer builds every successor state
    through these).  The copy is a new instance whose slots are set straight
    from the old one's, then the changed ones: for these plain records (no
    converter, validator or post-init) that is what the class's ``__init__``
    does, without reading the changes once per field.  A record whose slots
    are not exactly its fields (plus attrs' hash cache) is built through its
    ``__init__``; an unknown field name is an error either way."""
    fields = attrs.fields(cls)
    names = tuple(f.name for f in fields)
    slots = {n for k in cls.__mro__ for n in getattr(k, "__slots__", ())} - {"__weakref__"}
    plain = (not any(f.converter or f.validator for f in fields)
             and not hasattr(cls, "__attrs_post_init__")
             and slots - set(names) <= {_HASH_CACHE})
    scope = {"cls": cls, "new_": object.__new__, "fields": frozenset(names)}
    if plain:
        scope.update({f"set_{n}": cls.__dict__[n].__set__ for n in slots})
        scope["setters"] = {n: cls.__dict__[n].__set__ for n in names}
        body = "".join(f"    set_{n}(new, obj.{n})\n" for n in names)
        if _HASH_CACHE in slots:
            body += f"    set_{_HASH_CACHE}(new, None)\n"
        src = (f"def replace_{cls.__name__}(obj, ch):\n"
               f"    new = new_(cls)\n{body}"
               f"    for k, v in ch.items():\n"
               f"        if k not in fields:\n"
               f"            raise TypeError(f'{cls.__name__} has no field {{k!r}}')\n"
               f"        setters[k](new, v)\n"
               f"    return new\n")
    else:
        args = ", ".join(f"ch.pop({n!r}) if {n!r} in ch else obj.{n}" for n in names)
        src = (f"def replace_{cls.__name__}(obj, ch):\n"
               f"    new = cls({args})\n"
               f"    if ch:\n"
               f"        raise TypeError(f'{cls.__name__} has no field {{sorted(ch)[0]!r}}')\n"
               f"    return new\n")
    exec(compile(src, f"<replace {cls.__name__}>", "exec"), scope)
    return scope[f"replace_{cls.__name__}"]


# the slot in which attrs keeps a ``cache_hash`` class's hash (None: not yet
# computed); a class with another unknown slot is copied through its __init__
_HASH_CACHE = "_attrs_cached_hash"


class _Drafting:
    """The ``State`` one action's effect is building (``actions.core.action``
    opens and closes it around each effect).  An effect changes the state a
    field group at a time (``set_p``, ``set_room``, ``send``, ...); the first
    change copies the state it was given, the later ones go into that copy in
    place, so a step builds one new ``State`` however many groups it changes.
    Only a copy made inside the open effect is ever changed in place: the
    given state, and every state outside an effect, is never touched.  An
    effect must not keep a reference to the state it is building and read it
    after a later change (none does: ``tests/test_fast_paths.py`` compares
    every step of every built-in scenario with and without drafting).  One
    drafting per process: effects run on one thread (each engine's worker is
    a process of its own)."""

    __slots__ = ("open", "state")

    def __init__(self) -> None:
        self.open, self.state = False, None

    def begin(self) -> Tuple[bool, object]:
        was = self.open, self.state
        self.open, self.state = True, None
        return was

    def end(self, was: Tuple[bool, object]) -> None:
        self.open, self.state = was


DRAFTING = _Drafting()


def _change_in_place(obj, changes):
    for k, v in changes.items():
        setter = _STATE_SETTERS.get(k)
        if setter is None:
            raise TypeError(f"State has no field {k!r}")
        setter(obj, v)
    _STATE_SETTERS[_HASH_CACHE](obj, None)  # never hashed yet; kept honest
    return obj


_STATE_SETTERS: Dict[str, object] = {}
State: type = type(None)  # ``model.state.State``, once :func:`bind` has run


def replace(obj, **changes):
    """``attrs.evolve`` for the state's frozen classes, without its generic
    per-call introspection (the explorer calls it millions of times).
    Inside an effect a ``State`` is copied once and then changed in place
    (``_Drafting``)."""
    cls = type(obj)
    if cls is State and DRAFTING.open:
        if obj is DRAFTING.state:
            return _change_in_place(obj, changes)
        new = DRAFTING.state = _REPLACERS[State](obj, changes)
        return new
    fn = _REPLACERS.get(cls)
    if fn is None:
        # a subclass may bring its own copy (the Z3 engine's symbolic values
        # copy their raw, unread fields); the model knows no engine
        own = cls.__dict__.get("replace_fields")
        if own is not None:
            return own(obj, changes)
        fn = _REPLACERS[cls] = _replacer(cls)
    return fn(obj, changes)


def bind(state_cls: type) -> None:
    """Learn the ``State`` class (``model.state`` calls this once it is
    defined: this module imports nothing of it, so either can load first)."""
    global State
    State = state_cls
    _STATE_SETTERS.update({n: state_cls.__dict__[n].__set__ for n in attrs.fields_dict(state_cls)})
    _STATE_SETTERS[_HASH_CACHE] = state_cls.__dict__[_HASH_CACHE].__set__
    _REPLACERS[state_cls] = _replacer(state_cls)
