"""Entity tag schemes: parsing, validation, detection and conversion (pure functions).

A tag is `O` or `P-TYPE`: the prefix P is one of B, I, E, S (upper case) and TYPE is any non-empty
string. Types may contain "-" themselves (WNUT-17's `B-creative-work`), so a tag splits on its
first "-".

Validity is seqeval's strict mode (`seqeval.scheme.Entities(..., IOB2 / IOBES)`), so that on a
valid sequence `spans` finds exactly the entities strict seqeval scores:

* `iob2` (seqeval IOB2): B-X starts an entity and I-X continues one of type X, so I-X must
  directly follow B-X or I-X. E- and S- do not occur.
* `bioes` (seqeval IOBES): S-X is a one-word entity; a longer one is B-X I-X* E-X, all of one
  type. So B-X must be followed by I-X or E-X; I-X must follow B-X or I-X and be followed by I-X
  or E-X; E-X must follow B-X or I-X; S-X and O stand anywhere.
* `iob1` (the original CoNLL-2003 release): I-X starts an entity unless it continues one of
  type X, and B-X is used only to start an entity directly after another of the same type X.
  Not a seqeval scheme: readers convert it to IOB2.
* `none`: per-word labels that are not entities (POS tags); never parsed as entity tags.

Lenient decoders (seqeval's default `get_entities`, conlleval) accept any sequence and guess (an
I-X after O starts an entity); strict checking is why a file declared IOB2 that is not is an error
here rather than a silent guess.
"""
from __future__ import annotations

ENTITY_SCHEMES = ("iob1", "iob2", "bioes")
SCHEMES = ENTITY_SCHEMES + ("none",)
_PREFIXES = {"iob1": ("B", "I"), "iob2": ("B", "I"), "bioes": ("B", "I", "E", "S")}
_OUTSIDE = ("O", None)


class TagSequenceError(ValueError):
    """A sequence not valid in a scheme; `index` (0-based) lets a reader name the offending line."""

    def __init__(self, index: int, message: str):
        self.index = index
        super().__init__(message)


def parse_tag(tag: str) -> tuple[str, str | None]:
    """("O", None) or (prefix, type); ValueError naming the tag when it is neither."""
    if tag == "O":
        return _OUTSIDE
    if not isinstance(tag, str):
        raise TypeError(f"a tag is a string, got {tag!r}")
    prefix, sep, kind = tag.partition("-")
    if not sep:
        why = "no prefix: expected O or B-, I-, E-, S- followed by a type"
    elif prefix not in ("B", "I", "E", "S"):
        why = f"prefix {prefix!r} is not one of B, I, E, S"
    elif not kind.strip():
        why = "no entity type after the prefix"
    else:
        return prefix, kind
    raise ValueError(f"invalid entity tag {tag!r}: {why}")


def _parse_all(tags) -> list[tuple[str, str | None]]:
    out = []
    for i, tag in enumerate(tags):
        try:
            out.append(parse_tag(tag))
        except ValueError as e:
            raise TagSequenceError(i, f"tag {i} {tag!r}: {e}") from None
    return out


def _continues(prev: tuple[str, str | None], kind: str | None) -> bool:
    """Whether the previous tag is inside an entity of this type that may go on (B-X or I-X)."""
    return prev[0] in ("B", "I") and prev[1] == kind


def _starts_entity_with_i(prev: tuple[str, str | None], tag: tuple[str, str | None]) -> bool:
    """An I-X that begins an entity: IOB1's evidence (first tag, after O, E-, S- or another type)."""
    return tag[0] == "I" and not _continues(prev, tag[1])


def detect_scheme(sequences) -> str:
    """The entity scheme a file's tag sequences are written in.

    `bioes` if any E-/S- prefix occurs; else `iob1` if some I-X starts an entity; else `iob2`
    (also for all-O data, where every scheme reads the same). Raises ValueError on an invalid tag.
    """
    bioes = iob1 = False
    for tags in sequences:
        prev = _OUTSIDE
        for tag in _parse_all(tags):
            bioes = bioes or tag[0] in ("E", "S")
            iob1 = iob1 or _starts_entity_with_i(prev, tag)
            prev = tag
    return "bioes" if bioes else "iob1" if iob1 else "iob2"


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def validate(tags, scheme: str) -> None:
    """Raise `TagSequenceError` (a ValueError) naming the index and tag of the first tag the scheme
    does not allow there (the rules are in the module docstring). `none` accepts any labels."""
    _check_scheme(scheme)
    if scheme != "none":
        _checked(list(tags), scheme)


def _checked(tags: list[str], scheme: str) -> list[tuple[str, str | None]]:
    """The parsed tags of a sequence valid in an entity scheme (TagSequenceError otherwise)."""
    parsed = _parse_all(tags)
    allowed = _PREFIXES[scheme]
    for i, (p, t) in enumerate(parsed):
        prev = parsed[i - 1] if i else _OUTSIDE
        nxt = parsed[i + 1] if i + 1 < len(parsed) else _OUTSIDE
        if p == "O":
            continue
        if p not in allowed:
            why = f"{scheme.upper()} has no {p}- prefix"
        elif scheme == "iob2" and p == "I" and not _continues(prev, t):
            why = f"I-{t} must follow B-{t} or I-{t} in IOB2 (IOB1 data: read it with scheme iob1 or auto)"
        elif scheme == "iob1" and p == "B" and not _continues(prev, t):
            why = f"in IOB1, B-{t} only starts an entity directly after another {t} entity"
        elif scheme == "bioes" and p in ("I", "E") and not _continues(prev, t):
            why = f"{p}-{t} must follow B-{t} or I-{t} in BIOES"
        elif scheme == "bioes" and p in ("B", "I") and not (nxt[0] in ("I", "E") and nxt[1] == t):
            why = f"{p}-{t} must be followed by I-{t} or E-{t} in BIOES"
        else:
            continue
        raise TagSequenceError(i, f"tag {i} {tags[i]!r}: {why}")
    return parsed


def iob1_to_iob2(tags) -> list[str]:
    """IOB2 tags of a valid IOB1 sequence: every entity then starts with B- (same entities)."""
    tags = list(tags)
    parsed = _checked(tags, "iob1")
    out, prev = [], _OUTSIDE
    for tag, (p, t) in zip(tags, parsed):
        out.append(f"B-{t}" if _starts_entity_with_i(prev, (p, t)) else tag)
        prev = (p, t)
    return out


def iob2_to_bioes(tags) -> list[str]:
    """BIOES tags of a valid IOB2 sequence: an entity's last word gets E- (S- when it is alone)."""
    parsed = _checked(list(tags), "iob2")
    out = []
    for i, (p, t) in enumerate(parsed):
        goes_on = i + 1 < len(parsed) and parsed[i + 1] == ("I", t)
        if p == "O":
            out.append("O")
        elif p == "B":
            out.append(f"B-{t}" if goes_on else f"S-{t}")
        else:
            out.append(f"I-{t}" if goes_on else f"E-{t}")
    return out


def bioes_to_iob2(tags) -> list[str]:
    """IOB2 tags of a valid BIOES sequence (S- -> B-, E- -> I-)."""
    parsed = _checked(list(tags), "bioes")  # converting an invalid sequence would invent entities
    return ["O" if p == "O" else f"{'B' if p in ('B', 'S') else 'I'}-{t}" for p, t in parsed]


def to_iob2_prefixes(tags) -> list[str]:
    """BIOES predictions written in IOB2's prefixes (S- -> B-, E- -> I-), tag by tag, without
    validating: the mapping `bioes_to_iob2` applies to a valid sequence, extended to any sequence a
    model may predict. Strict IOB2 then reads an entity where a B- (or S-) starts a run of I- (or E-)
    of its type, as it reads an IOB2 model's predictions."""
    out = []
    for tag in tags:
        prefix, sep, kind = tag.partition("-")
        out.append(f"{'B' if prefix == 'S' else 'I'}-{kind}" if sep and prefix in ("S", "E") else tag)
    return out


def convert(tags, source: str, target: str) -> list[str]:
    """The tags of a valid `source` sequence written in `target` (iob1 -> iob2 / bioes,
    iob2 <-> bioes); the entities are unchanged. ValueError on an invalid sequence."""
    for name, value in (("source", source), ("target", target)):
        if value not in ENTITY_SCHEMES:
            raise ValueError(f"{name} scheme must be one of {ENTITY_SCHEMES}, got {value!r}")
    if target == "iob1" and source != "iob1":
        raise ValueError(f"conversion to iob1 is not supported (from {source})")
    tags = list(tags)
    if source == target:
        validate(tags, source)
        return tags
    if source == "iob1":
        iob2 = iob1_to_iob2(tags)
    elif source == "bioes":
        iob2 = bioes_to_iob2(tags)
    else:
        iob2 = tags  # to BIOES, which validates it
    return iob2 if target == "iob2" else iob2_to_bioes(iob2)


def spans(tags, scheme: str) -> list[tuple[str, int, int]]:
    """(type, start, end exclusive) of each entity of a valid sequence, in order (ValueError if
    it is not valid: a guess would not be the entities strict seqeval scores)."""
    if scheme not in ENTITY_SCHEMES:
        raise ValueError(f"spans need an entity scheme {ENTITY_SCHEMES}, got {scheme!r}")
    tags = list(tags)
    parsed = _checked(tags if scheme == "iob2" else convert(tags, scheme, "iob2"), "iob2")
    out, start = [], None
    for i, (p, t) in enumerate(parsed + [_OUTSIDE]):
        if start is not None and p != "I":  # valid IOB2: only I- continues the open entity
            out.append((parsed[start][1], start, i))
            start = None
        if p == "B":
            start = i
    return out
