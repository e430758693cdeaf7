"""The Archiver Appliance's post-processors, computed from a channel's rows.

A request names one as `OP_N(PV)` (`mean_60(PV)`: 60 s bins). Bins are the Archiver
Appliance's: POSIX seconds divided by N, each answered at its middle (`bin * N + N // 2`, half a
second more for an odd N); the last sample before `from` goes into the bin before the first;
`mean`, `min`, `max`, `count`, `std` and `optimized` fill an empty bin with the one before
(their `...Sample` variants leave it out; `count` fills with 0); `firstSample`, `lastSample`
and `nth` answer samples as they were; `ncount` one count at `from`; `optimized_N` the samples
when at most N, else about N bins of [mean, std, min, max, count] (`optimLastSample`: and the
last value). An operator the Archiver Appliance does not know is ignored (the samples as they
were), as it does; one it knows that pvwire does not compute is refused, saying which it does.

Rows (`rows_of`) come from the finest part of the history that reaches back to `from`: the raw
points, or one tier's buckets, each then read as one sample at its start (its last value) and
as the aggregate it is (min, max, sum and count of its updates). A tier keeps no sum of squares
and no first value: `std` of a bucket is NaN, `firstSample` takes a bucket's last value.
Every function here is pure: columns in, columns out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .pb import PayloadType

__all__ = [
    "BadOperator",
    "Operator",
    "Rows",
    "Series",
    "bin_seconds",
    "compute",
    "estimate",
    "parse_pv",
]

NS = 1_000_000_000
DEFAULT_INTERVAL = 15 * 60  # the Archiver Appliance's, when the request gives none
DEFAULT_POINTS = 1000  # optimized's

# Every post-processor name the Archiver Appliance registers, in its order: it takes the first
# that the request's name starts with (so `meanSample_60` is mean's variant, `meanX_60` mean).
_KNOWN = (
    "firstSample", "meanSample", "mean", "jitterSample", "jitter", "stdSample", "std",
    "ignoreflyersSample", "ignoreflyers", "flyersSample", "flyers", "linear", "loess",
    "medianSample", "median", "varianceSample", "variance", "popvarianceSample", "popvariance",
    "kurtosisSample", "kurtosis", "skewnessSample", "skewness", "firstFill", "lastFill",
    "lastSample", "maxSample", "max", "minSample", "min", "countSample", "count", "ncount",
    "nth", "statisticsSample", "statistics", "optimLastSampleSample", "optimLastSample",
    "optimizedSample", "optimized", "caplotbinning", "deadBand", "errorbarSample", "errorbar",
)  # fmt: skip
_BINNED = {"mean", "min", "max", "count", "std"}
SUPPORTED = ("firstSample", "lastSample", "mean", "min", "max", "count", "std", "nth",
             "ncount", "optimized", "optimLastSample")  # fmt: skip
_CALL = re.compile(r"([A-Za-z][A-Za-z0-9_]*)\((.+)\)", re.DOTALL)


class BadOperator(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Operator:
    name: str  # one of SUPPORTED
    n: int  # bin seconds; optimized: points; nth: every n-th
    fill: bool  # an empty bin repeats the one before (mean_N, not meanSample_N)
    spelled: str  # as the request wrote it


def parse_pv(text: str) -> tuple[Operator | None, str]:
    """(operator, PV) of a request's `pv`: `mean_60(PV)` or `PV`. A name whose opening word
    is not an identifier (`sim://sine(-10, 10, 0.2)`) is a PV name with parentheses."""
    found = _CALL.fullmatch(text)
    if found is None:
        return None, text
    spelled, pv = found.group(1), found.group(2)
    key = next((k for k in _KNOWN if spelled.startswith(k)), None)
    if key is None:
        return None, pv  # unknown to the Archiver Appliance too: the samples as they were
    fill = not key.endswith("Sample") or key in ("firstSample", "lastSample", "optimLastSample")
    name = key[: -len("Sample")] if not fill else key
    if name not in SUPPORTED:
        raise BadOperator(
            f"pvwire does not compute {spelled} from its history; it computes "
            + ", ".join(f"{s}_N" for s in SUPPORTED)
        )
    n = DEFAULT_POINTS if name in ("optimized", "optimLastSample") else DEFAULT_INTERVAL
    if "_" in spelled:
        arg = spelled.split("_")[1]
        if not arg.isdigit() or not 0 < int(arg) < 1 << 31:
            raise BadOperator(f"{spelled}: N must be a whole number from 1 to {(1 << 31) - 1}")
        n = int(arg)
    return Operator(name, n, fill, spelled), pv


@dataclass(frozen=True, slots=True)
class Rows:
    """What a post-processor reads, oldest first: raw points (`width` 0), or buckets of `width`
    ns, each at its start with its last value. Every row is also the aggregate of the values
    it holds (a point: of itself, unless NaN): `lo`, `hi`, `total`, `count`. Gap rows (the
    channel went away) hold no value; they mark what follows them."""

    t: npt.NDArray[np.int64]
    value: npt.NDArray[np.float64]  # 2-D for an array channel: a frame per row
    lo: npt.NDArray[np.float64]
    hi: npt.NDArray[np.float64]
    total: npt.NDArray[np.float64]
    count: npt.NDArray[np.int64]
    severity: npt.NDArray[np.int64]
    status: npt.NDArray[np.int64]
    gap: npt.NDArray[np.bool_]
    width: int

    def __len__(self) -> int:
        return len(self.t)

    def take(self, sel: Any) -> Rows:
        return Rows(self.t[sel], self.value[sel], self.lo[sel], self.hi[sel], self.total[sel],
                    self.count[sel], self.severity[sel], self.status[sel], self.gap[sel],
                    self.width)  # fmt: skip

    @property
    def vector(self) -> bool:
        return self.value.ndim == 2


@dataclass(slots=True)
class Series:
    """One PV's answer, as columns: what `answers` writes. `value` is an array (2-D for
    vectors) or a list of str; `fields` holds a row's field values, by row."""

    ptype: PayloadType
    t: npt.NDArray[np.int64]
    value: Any
    severity: npt.NDArray[np.int64]
    status: npt.NDArray[np.int64]
    elements: int = 1
    fields: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.t)

    @property
    def points(self) -> int:
        return len(self.t) * max(self.elements, 1)


def estimate(op: Operator | None, rows: Rows, since: int, until: int) -> int:
    """At most how many samples `compute` answers (an array's elements counted), known before
    computing it: what a request's bounds are checked against."""
    per = rows.value.shape[1] if rows.vector else 1
    if op is None or rows.vector or op.name in ("firstSample", "lastSample", "nth"):
        return (len(rows) + 1) * per
    if op.name == "ncount":
        return 1
    n = _interval(op, since, until)
    bins = until // NS // n - since // NS // n + 2
    if op.name in ("optimized", "optimLastSample"):
        wide = 5 if op.name == "optimized" else 6
        return max(len(rows) + 1, (bins if op.fill else min(bins, len(rows) + 1)) * wide)
    return bins if op.fill else min(bins, len(rows) + 1)


def bin_seconds(op: Operator, since: int, until: int) -> int:
    """The width (s) of `op`'s bins over `since` to `until` (ns): its N, or for `optimized`
    and `optimLastSample` the range divided by N (an archive behind the history is asked for
    bins of the same width: core/archive/)."""
    return _interval(op, since, until) if op.name in ("optimized", "optimLastSample") else op.n


def _interval(op: Operator, since: int, until: int) -> int:
    if op.name == "optimized":
        return max(1, (until // NS - since // NS) // op.n)
    if op.name == "optimLastSample":
        return max(1, (until // 1_000_000 - since // 1_000_000) // (1000 * op.n))
    return op.n


def compute(op: Operator | None, rows: Rows, ptype: PayloadType, since: int,
            until: int) -> Series:  # fmt: skip
    """The answer of `op` (None: the samples as they were) over `rows`, between `since` and
    `until` (ns). `ptype`: the channel's own type, for answers of samples as they were."""
    fields = _reconnections(rows)
    samples = ~rows.gap
    keeps = ("firstSample", "lastSample", "nth", "ncount")  # what an array channel answers
    if op is None or (rows.vector and op.name not in keeps):
        return _samples(rows, ptype, fields, _raw(rows, samples, since))
    ms = rows.t // 1_000_000  # ncount and nth compare milliseconds, as the Archiver Appliance
    if op.name == "ncount":
        inside = (ms >= since // 1_000_000) & (ms <= until // 1_000_000)
        total = int(rows.count[inside & samples].sum())
        return Series(PayloadType.SCALAR_INT, np.array([since // 1_000_000 * 1_000_000]),
                      np.array([total], np.float64), np.zeros(1, np.int64),
                      np.zeros(1, np.int64))  # fmt: skip
    if op.name == "nth":
        keep = np.flatnonzero(samples & (ms >= since // 1_000_000) & (ms <= until // 1_000_000))
        return _samples(rows, ptype, fields, keep[:: op.n])
    if op.name in ("firstSample", "lastSample"):
        return _samples(rows, ptype, fields, _edges(rows, samples, op, since, until))
    if op.name in ("optimized", "optimLastSample"):
        return _optimized(rows, samples, ptype, fields, op, since, until)
    return _binned(rows, samples, op, since, until)


def _reconnections(rows: Rows) -> dict[int, tuple[tuple[str, str], ...]]:
    """The fields the Archiver Appliance's engine puts on the first sample after a disconnect:
    when the connection was lost (the first gap since the sample before) and when it came back
    (POSIX seconds)."""
    gaps = np.flatnonzero(rows.gap)
    if not len(gaps):
        return {}
    after = np.flatnonzero(~rows.gap)
    out: dict[int, tuple[tuple[str, str], ...]] = {}
    for g, j in zip(gaps.tolist(), np.searchsorted(after, gaps).tolist(), strict=True):
        if j < len(after) and int(after[j]) not in out:
            i = int(after[j])
            out[i] = (("cnxlostepsecs", str(int(rows.t[g]) // NS)),
                      ("cnxregainedepsecs", str(int(rows.t[i]) // NS)))  # fmt: skip
    return out


def _raw(rows: Rows, samples: npt.NDArray[np.bool_], since: int) -> npt.NDArray[np.intp]:
    """The samples as the Archiver Appliance sends them: the last one at or before `since`
    (the value a plot starts with), then every later one."""
    idx = np.flatnonzero(samples)
    before = np.flatnonzero(rows.t[idx] <= since)
    return idx[before[-1] :] if len(before) else idx


def _samples(rows: Rows, ptype: PayloadType, fields: dict[int, tuple[tuple[str, str], ...]],
             idx: npt.NDArray[np.intp]) -> Series:  # fmt: skip
    kept = {j: fields[i] for j, i in enumerate(idx.tolist()) if i in fields}
    return Series(ptype, rows.t[idx], rows.value[idx], rows.severity[idx], rows.status[idx],
                  rows.value.shape[1] if rows.vector else 1, kept)  # fmt: skip


def _edges(rows: Rows, samples: npt.NDArray[np.bool_], op: Operator, since: int,
           until: int) -> npt.NDArray[np.intp]:  # fmt: skip
    """firstSample / lastSample: the first (last) sample of each bin from `since`'s to
    `until`'s, after the last sample of the bins before."""
    idx = np.flatnonzero(samples)
    bins = rows.t[idx] // NS // op.n
    first, last = since // NS // op.n, until // NS // op.n
    before = idx[bins < first]
    inside = (bins >= first) & (bins <= last)
    idx, bins = idx[inside], bins[inside]
    if len(idx):
        change = np.flatnonzero(np.diff(bins)) + 1
        if op.name == "firstSample":
            idx = idx[np.concatenate(([0], change))]
        else:
            idx = idx[np.concatenate((change - 1, [len(idx) - 1]))]
    return np.concatenate((before[-1:], idx)).astype(np.intp)


@dataclass(frozen=True, slots=True)
class _Bins:
    """Per bin with samples (`key`, ascending): the statistics of its values."""

    key: npt.NDArray[np.int64]
    mean: npt.NDArray[np.float64]
    std: npt.NDArray[np.float64]
    lo: npt.NDArray[np.float64]
    hi: npt.NDArray[np.float64]
    count: npt.NDArray[np.int64]
    last: npt.NDArray[np.float64]
    severity: npt.NDArray[np.int64]
    reconnected: npt.NDArray[np.bool_]


def _bin(rows: Rows, samples: npt.NDArray[np.bool_], n: int, since: int, until: int) -> _Bins:
    """The samples from `since` to `until` in bins of `n` s, and the last one before `since` in
    the bin before the first (unless one lies at `since` itself)."""
    first = since // NS // n
    inside = samples & (rows.t >= since) & (rows.t <= until)
    pre = np.flatnonzero(samples & (rows.t < since))
    keys = rows.t // NS // n
    use = inside.copy()
    if len(pre) and not np.any(inside & (rows.t == since)):
        use[pre[-1]] = True
        keys = keys.copy()
        keys[pre[-1]] = first - 1
    gaps = rows.gap & (rows.t >= since) & (rows.t <= until)
    idx = np.flatnonzero(use)
    if not len(idx):
        empty_f, empty_i = np.zeros(0), np.zeros(0, np.int64)
        return _Bins(empty_i, empty_f, empty_f, empty_f, empty_f, empty_i, empty_f, empty_i,
                     np.zeros(0, bool))  # fmt: skip
    k = keys[idx]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(k)) + 1))
    value = rows.value[idx]
    if rows.width:  # buckets: their own aggregates; NaN in a bucket is in its sum
        count = rows.count[idx]
        total = rows.total[idx]
        lo, hi = rows.lo[idx], rows.hi[idx]
        std_known = False
    else:  # points: a NaN value counts for nothing, as the Archiver Appliance skips it
        finite = ~np.isnan(value)
        count = finite.astype(np.int64)
        total = np.where(finite, value, 0.0)
        lo, hi = np.where(finite, value, np.inf), np.where(finite, value, -np.inf)
        std_known = True
    n_bin = np.add.reduceat(count, starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.add.reduceat(total, starts) / n_bin
        lo_bin = np.minimum.reduceat(lo, starts)
        hi_bin = np.maximum.reduceat(hi, starts)
        if std_known:
            dev = np.where(finite, value - np.repeat(mean, np.diff(np.append(starts, len(k)))), 0)
            var = np.add.reduceat(dev * dev, starts) / np.maximum(n_bin - 1, 1)
            std = np.where(n_bin > 0, np.sqrt(var), np.nan)
        else:
            std = np.full(len(starts), np.nan)
    empty = n_bin == 0
    mean[empty], lo_bin[empty], hi_bin[empty] = np.nan, np.nan, np.nan
    ends = np.append(starts[1:], len(k)) - 1
    last_rows = value
    if std_known:  # the last value that is not NaN, as optimLastSample keeps it
        last_rows = np.where(finite, value, np.nan)
        filled = np.maximum.accumulate(np.where(finite, np.arange(len(value)), 0))
        last_rows = value[filled]
    gap_keys = np.unique(keys[gaps])
    return _Bins(
        key=k[starts],
        mean=mean,
        std=std,
        lo=lo_bin,
        hi=hi_bin,
        count=n_bin,
        last=last_rows[ends],
        severity=np.maximum.reduceat(rows.severity[idx], starts),
        reconnected=np.isin(k[starts], gap_keys),
    )


def _expand(b: _Bins, fill: bool, last_bin: int) -> tuple[npt.NDArray[np.int64],
                                                         npt.NDArray[np.intp]]:  # fmt: skip
    """The bins answered and, for each, which bin of `b` gives its values (-1: none, an empty
    bin a filling post-processor answers anyway): every bin from the first with samples to
    `last_bin` when filling, else those with samples."""
    if not fill or not len(b.key):
        return b.key, np.arange(len(b.key))
    keys = np.arange(int(b.key[0]), max(int(b.key[-1]), last_bin) + 1)
    src = np.searchsorted(b.key, keys, side="right") - 1
    return keys, np.where(b.key[src] == keys, src, -1 - src)


def _times(keys: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    return (keys * n + n // 2) * NS + (NS // 2 if n % 2 else 0)


def _binned(rows: Rows, samples: npt.NDArray[np.bool_], op: Operator, since: int,
            until: int) -> Series:  # fmt: skip
    b = _bin(rows, samples, op.n, since, until)
    keys, src = _expand(b, op.fill, until // NS // op.n)
    stat = {"mean": b.mean, "min": b.lo, "max": b.hi, "std": b.std,
            "count": b.count.astype(np.float64)}[op.name]  # fmt: skip
    own = src >= 0
    at = np.where(own, src, -1 - src)
    value = stat[at] if len(at) else np.zeros(0)
    severity = b.severity[at] if len(at) else np.zeros(0, np.int64)
    if op.name == "count":  # an empty bin counts nothing (the Archiver Appliance's zero-out)
        value = np.where(own, value, 0.0)
        severity = np.where(own, severity, 0)
    return Series(PayloadType.SCALAR_DOUBLE, _times(keys, op.n), value.astype(np.float64),
                  severity.astype(np.int64), np.zeros(len(keys), np.int64), 1,
                  _changes(b, own, at))  # fmt: skip


def _optimized(rows: Rows, samples: npt.NDArray[np.bool_], ptype: PayloadType,
               fields: dict[int, tuple[tuple[str, str], ...]], op: Operator, since: int,
               until: int) -> Series:  # fmt: skip
    """The samples if they are at most N (those of `from` to `to`, and the one before), else
    bins of about (to - from) / N seconds of [mean, std, min, max, count(, last)]."""
    inside = np.flatnonzero(samples & (rows.t >= since) & (rows.t <= until))
    pre = np.flatnonzero(samples & (rows.t < since))[-1:]
    idx = np.concatenate((pre, inside)).astype(np.intp)
    events = int(rows.count[idx].sum()) if rows.width else len(idx)
    if events <= op.n:
        return _samples(rows, ptype, fields, idx)
    n = _interval(op, since, until)
    b = _bin(rows, samples, n, since, until)
    keys, src = _expand(b, op.fill, until // NS // n)
    own = src >= 0
    at = np.where(own, src, -1 - src)
    columns = [b.mean, b.std, b.lo, b.hi, b.count.astype(np.float64)]
    if op.name == "optimLastSample":
        columns.append(b.last)
    value = np.stack([c[at] for c in columns], axis=1) if len(at) else np.zeros((0, len(columns)))
    if op.name == "optimLastSample" and len(at):
        # An empty bin: [last, 0, last, last, 0, last] of the bin before, as it fills them.
        last = value[:, 5].copy()
        value[~own] = np.stack([last, 0 * last, last, last, 0 * last, last], axis=1)[~own]
    severity = b.severity[at] if len(at) else np.zeros(0, np.int64)
    return Series(PayloadType.WAVEFORM_DOUBLE, _times(keys, n), value, severity.astype(np.int64),
                  np.zeros(len(keys), np.int64), len(columns), _changes(b, own, at))  # fmt: skip


def _changes(b: _Bins, own: npt.NDArray[np.bool_],
             at: npt.NDArray[np.intp]) -> dict[int, tuple[tuple[str, str], ...]]:  # fmt: skip
    """A bin whose span holds a disconnect says so, as the Archiver Appliance's do."""
    if not len(at):
        return {}
    changed = np.flatnonzero(own & b.reconnected[at]).tolist()
    return {i: (("connectionChange", "true"),) for i in changed}
