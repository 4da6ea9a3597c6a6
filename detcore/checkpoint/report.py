"""What a checkpoint load did, key by key, as data and as a table for the log.

A partial load that goes unnoticed (a renamed layer left at its random init) is the classic
silent failure of fine-tuning; the report makes every key's fate visible: mapped, missing from
the checkpoint, unexpected (no place in the model), shape disagreements, deliberately dropped
entries, and predictor layers re-initialized for a different class count.
"""
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

__all__ = ["LoadReport"]

Shape = Tuple[int, ...]


def _fmt_shape(shape: Optional[Shape]) -> str:
    return "" if shape is None else str(tuple(int(s) for s in shape))


@dataclass
class LoadReport:
    """Every key's fate in one checkpoint load.

    Attributes:
        source: the file (or a description of the state dict) that was read.
        format: the detected (or given) checkpoint format.
        mapped: (checkpoint key, model key, shape) for every tensor loaded.
        missing: (model key, shape) for model entries the checkpoint does not provide; they
            keep the model's initialization.
        unexpected: (checkpoint key, converted name, shape) for checkpoint tensors with no place
            in the model.
        shape_mismatch: (checkpoint key, model key, checkpoint shape, model shape); not loaded.
        dropped: (checkpoint key, reason) for entries left out on purpose (an ImageNet
            classifier, BatchNorm step counters, metadata).
        reinitialized: (checkpoint key, model key, checkpoint shape, model shape) for predictor
            layers whose class count differs; they keep the model's initialization.
        notes: sentences about conversions done (class order) and likely mistakes (stride or
            channel-order settings that do not fit the weights).
    """

    source: str
    format: str
    mapped: List[Tuple[str, str, Shape]] = field(default_factory=list)
    missing: List[Tuple[str, Shape]] = field(default_factory=list)
    unexpected: List[Tuple[str, str, Shape]] = field(default_factory=list)
    shape_mismatch: List[Tuple[str, str, Shape, Shape]] = field(default_factory=list)
    dropped: List[Tuple[str, str]] = field(default_factory=list)
    reinitialized: List[Tuple[str, str, Shape, Shape]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when every model entry was loaded and every checkpoint tensor was used (or
        dropped on purpose)."""
        return not (self.missing or self.unexpected or self.shape_mismatch or self.reinitialized)

    def summary(self) -> str:
        counts = [
            f"mapped {len(self.mapped)}",
            f"missing {len(self.missing)}",
            f"unexpected {len(self.unexpected)}",
            f"shape mismatch {len(self.shape_mismatch)}",
            f"re-initialized {len(self.reinitialized)}",
            f"dropped {len(self.dropped)}",
        ]
        return f"Checkpoint {self.source} ({self.format}): " + ", ".join(counts)

    def rows(self, group: bool = True) -> List[Tuple[str, str, str, str]]:
        """(status, checkpoint key, model key or reason, shape), problems first. With ``group``,
        keys of one module (a conv's weight and bias, a norm's four tensors) share a row, and a
        reason for dropping shared by many keys takes one row."""
        out = []
        for ckpt, model, cshape, mshape in self.shape_mismatch:
            out.append(("SHAPE MISMATCH", ckpt, model, f"{_fmt_shape(cshape)} vs model {_fmt_shape(mshape)}"))
        for ckpt, name, shape in self.unexpected:
            out.append(("UNEXPECTED", ckpt, f"(as {name})" if name != ckpt else "", _fmt_shape(shape)))
        missing = [("", model, _fmt_shape(shape)) for model, shape in self.missing]
        out += [("MISSING",) + r for r in (_group(missing) if group else missing)]
        for ckpt, model, cshape, mshape in self.reinitialized:
            out.append(("RE-INITIALIZED", ckpt, model, f"{_fmt_shape(cshape)} vs model {_fmt_shape(mshape)}"))
        dropped = _group_dropped(self.dropped) if group else [(k, why, "") for k, why in self.dropped]
        out += [("dropped",) + r for r in dropped]
        mapped = [(ckpt, model, _fmt_shape(shape)) for ckpt, model, shape in self.mapped]
        out += [("mapped",) + r for r in (_group(mapped) if group else mapped)]
        return out

    def table(self, group: bool = True) -> str:
        """The summary line, a table of all keys (see `rows`) and the notes."""
        rows = self.rows(group)
        header = ("status", "checkpoint key", "model key", "shape")
        widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(3)]
        fmt = "  {:<%d}  {:<%d}  {:<%d}  {}" % tuple(widths)
        lines = [self.summary(), fmt.format(*header).rstrip(), "  " + "-" * (sum(widths) + 6 + len(header[3]))]
        lines.extend(fmt.format(*r).rstrip() for r in rows)
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _split(key: str) -> Tuple[str, str]:
    if "." not in key:
        return "", key
    module, leaf = key.rsplit(".", 1)
    return module + ".", leaf


def _group(rows: List[Tuple[str, str, str]]) -> List[Tuple[str, str, str]]:
    """Merge (checkpoint key, model key, shape) rows whose keys differ only in a last name
    component they share, e.g. ``bn1.{weight,bias}``; shapes are listed once each."""
    groups = OrderedDict()
    for ckpt, model, shape in rows:
        c_mod, c_leaf = _split(ckpt)
        m_mod, m_leaf = _split(model)
        if ckpt and c_leaf != m_leaf:
            groups[(ckpt, model, len(groups))] = [[c_leaf], [shape]]  # a renamed leaf: own row
            continue
        entry = groups.setdefault((c_mod if ckpt else None, m_mod, None), [[], []])
        entry[0].append(m_leaf)
        if shape not in entry[1]:
            entry[1].append(shape)
    out = []
    for (c_mod, m_mod, own), (leaves, shapes) in groups.items():
        if own is not None:
            out.append((c_mod, m_mod, shapes[0]))
            continue
        leaf = leaves[0] if len(leaves) == 1 else "{" + ",".join(leaves) + "}"
        out.append((c_mod + leaf if c_mod is not None else "", m_mod + leaf, " ".join(shapes)))
    return out


def _group_dropped(dropped: List[Tuple[str, str]]) -> List[Tuple[str, str, str]]:
    by_reason = OrderedDict()
    for key, why in dropped:
        by_reason.setdefault(why, []).append(key)
    out = []
    for why, keys in by_reason.items():
        if len(keys) > 3:
            out.append((f"{len(keys)} keys, e.g. {keys[0]}", why, ""))
        else:
            out.extend((k, why, "") for k in keys)
    return out
