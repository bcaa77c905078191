"""Entity tag schemes: parsing, validation, detection and conversion (pure functions).

A tag is `O` or `P-TYPE` with prefix P in B/I/E/S; the type may contain "-" (WNUT-17's
`B-creative-work`): it is split on the first "-". Schemes, as seqeval's strict mode reads them:

* IOB2 (`iob2`): every entity starts with B-X; I-X continues an entity of type X.
* IOB1 (`iob1`, CoNLL-2003's original): I-X starts an entity too; B-X only starts an entity that
  directly follows another of the same type. Converted to IOB2 on reading.
* BIOES (`bioes`, seqeval's IOBES): S-X is a one-word entity; longer ones are B-X I-X* E-X.
* `none`: per-word labels that are not entities (POS tags): never validated as entity tags.
"""
from __future__ import annotations

ENTITY_SCHEMES = ("iob1", "iob2", "bioes")
PREFIXES = {"iob1": "BI", "iob2": "BI", "bioes": "BIES"}


def parse_tag(tag: str) -> tuple[str, str | None]:
    """("O", None) or (prefix, type); ValueError naming the tag when it is neither."""
    if tag == "O":
        return "O", None
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I", "E", "S") or not kind:
        raise ValueError(f"invalid entity tag {tag!r}: expected O or B-, I-, E-, S- followed by a type")
    return prefix, kind


def detect_scheme(sequences) -> str:
    """`bioes` when E-/S- prefixes occur, `iob1` when some I-X starts an entity, else `iob2`."""
    iob1 = False
    for tags in sequences:
        prev = ("O", None)
        for tag in tags:
            p, t = parse_tag(tag)
            if p in ("E", "S"):
                return "bioes"
            if p == "I" and (prev[0] == "O" or prev[1] != t):
                iob1 = True
            prev = (p, t)
    return "iob1" if iob1 else "iob2"


def validate(tags, scheme: str) -> None:
    """ValueError naming the position and tag of the first tag the scheme does not allow there."""
    parsed = [parse_tag(t) for t in tags]
    allowed = PREFIXES[scheme]
    for i, (p, t) in enumerate(parsed):
        if p != "O" and p not in allowed:
            raise ValueError(f"tag {i + 1} ({tags[i]!r}) has a prefix {scheme} does not use")
        prev = parsed[i - 1] if i else ("O", None)
        nxt = parsed[i + 1] if i + 1 < len(parsed) else ("O", None)
        if scheme == "iob2" and p == "I" and not (prev[0] in "BI" and prev[0] != "O" and prev[1] == t):
            raise ValueError(f"tag {i + 1} ({tags[i]!r}) does not continue a {t} entity (IOB2 starts entities "
                             "with B-; use scheme iob1 or auto for IOB1 data)")
        if scheme == "iob1" and p == "B" and not (prev[0] in "BI" and prev[0] != "O" and prev[1] == t):
            raise ValueError(f"tag {i + 1} ({tags[i]!r}): in IOB1, B- only follows an entity of the same type")
        if scheme == "bioes":
            inside = prev[0] in ("B", "I") and prev[1] == t
            if p in ("I", "E") and not inside:
                raise ValueError(f"tag {i + 1} ({tags[i]!r}) does not continue a B-{t} or I-{t}")
            if p in ("B", "I") and not (nxt[0] in ("I", "E") and nxt[1] == t):
                raise ValueError(f"tag {i + 1} ({tags[i]!r}) is not followed by I-{t} or E-{t}")


def iob1_to_iob2(tags) -> list[str]:
    out, prev = [], ("O", None)
    for tag in tags:
        p, t = parse_tag(tag)
        if p == "I" and (prev[0] == "O" or prev[1] != t):
            tag = f"B-{t}"  # IOB1 starts an entity with I- unless it follows one of the same type
        out.append(tag)
        prev = (p, t)
    return out


def iob2_to_bioes(tags) -> list[str]:
    out = []
    for i, tag in enumerate(tags):
        p, t = parse_tag(tag)
        cont = i + 1 < len(tags) and parse_tag(tags[i + 1]) == ("I", t)
        if p == "B":
            out.append(f"B-{t}" if cont else f"S-{t}")
        elif p == "I":
            out.append(f"I-{t}" if cont else f"E-{t}")
        else:
            out.append(tag)
    return out


def bioes_to_iob2(tags) -> list[str]:
    out = []
    for tag in tags:
        p, t = parse_tag(tag)
        out.append(tag if p == "O" else f"{'B' if p in ('B', 'S') else 'I'}-{t}")
    return out


def convert(tags, source: str, target: str) -> list[str]:
    """Tags of a valid `source` sequence in `target` (iob1 -> iob2/bioes, iob2 <-> bioes)."""
    tags = list(tags)
    if source == target:
        return tags
    iob2 = {"iob1": iob1_to_iob2, "iob2": list, "bioes": bioes_to_iob2}[source](tags)
    if target == "iob2":
        return iob2
    if target == "bioes":
        return iob2_to_bioes(iob2)
    raise ValueError(f"cannot convert {source} to {target}")


def spans(tags, scheme: str) -> list[tuple[str, int, int]]:
    """(type, start, end exclusive) of each entity of a valid sequence."""
    tags = convert(tags, scheme, "iob2") if scheme != "iob2" else list(tags)
    out, start, kind = [], None, None
    for i, tag in enumerate(tags + ["O"]):
        p, t = parse_tag(tag)
        if start is not None and p != "I":
            out.append((kind, start, i))
            start = None
        if p == "B":
            start, kind = i, t
    return out
