"""Declarative contract schemas and the one validation routine they share.

A schema lists its fields (kind, required, nullable, bounds, enum values), a
unique key and row rules. `validate_frame` checks a raw DataFrame against it
and splits it into valid rows (coerced to canonical dtypes) and a quarantine
(the raw row plus a reason code and a detail). Every row read ends in exactly
one of the two: nothing is dropped silently.

File-level problems (a required column missing, a version this code does not
know, a forbidden column) are not row problems: they raise `ContractError`
with a one-line message naming the source and the problem.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from replaylab.contracts.columns import QUARANTINE_DETAIL, QUARANTINE_REASON, SOURCE_ROW
from replaylab.contracts.errors import InputError

Kind = Literal["str", "int", "float", "bool", "timestamp", "enum", "list"]

# Key of `ValidationResult.valid.attrs` naming where the rows came from (the file), so a
# reader further down (e.g. the router's outcome matrix) can name it in its errors.
SOURCE_ATTR = "contract_source"

# Epoch-ms bounds a plausible timestamp lies in: [1970-01-01, 2200-01-01).
_TS_MIN_MS = 0
_TS_MAX_MS = 7_258_118_400_000


class ContractError(InputError, ValueError):
    """A file or frame that cannot be read as the contract at all (not a row problem)."""


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    required: bool = False  # the column must be present in the file
    nullable: bool = True  # a null value is allowed
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    values: tuple[str, ...] = ()  # enum values
    below_min_reason: str = "out_of_range"


# A row rule sees the coerced frame (only rows still valid) and returns a mask of
# offending rows, the reason code and a detail string.
RowRule = Callable[[pd.DataFrame], tuple[pd.Series, str, str]]


@dataclass(frozen=True)
class Schema:
    name: str  # e.g. "ledger-v1"
    version_column: str
    supported_versions: tuple[str, ...]
    fields: tuple[Field, ...]
    unique_key: tuple[str, ...] = ()
    duplicate_reason: str = "duplicate_key"
    row_rules: tuple[RowRule, ...] = ()
    forbidden_columns: tuple[str, ...] = ()  # presence is a file-level error (privacy)

    @property
    def required_columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def column(self, frame: pd.DataFrame, name: str) -> pd.Series:
        """`frame[name]`, or an all-null Series of the field's canonical dtype if it is absent.

        The contracts say "null when unknown", so an absent optional column and an
        all-null one are the same thing to every reader: code that reads an
        optional column takes it from here (or branches on `has_values`), never
        from `frame[name]` alone, which raises KeyError on a valid file.
        """
        if name in frame.columns:
            return frame[name]
        kind = self.field(name).kind
        dtype = _NULL_DTYPES[kind]
        fill = np.nan if dtype == "float64" else (None if dtype is object else pd.NA)
        return pd.Series(fill, index=frame.index, dtype=dtype, name=name)


# Canonical dtype of an all-null column of each kind (what validate_frame makes of one).
_NULL_DTYPES: dict[str, object] = {"int": "Int64", "timestamp": "Int64", "float": "float64",
                                   "bool": "boolean", "str": object, "enum": object,
                                   "list": object}


def has_values(frame: pd.DataFrame, name: str) -> bool:
    """True when `frame` holds column `name` with at least one non-null value.

    The test a branch on an optional column makes: absent and all null take the
    same branch (the contracts' "null when unknown"), so a file whose optional
    column is present but empty reads exactly like one without it.
    """
    return name in frame.columns and bool(frame[name].notna().any())


@dataclass
class ValidationResult:
    """Valid rows (canonical dtypes) and quarantined rows (raw, with reasons).

    `valid.attrs[SOURCE_ATTR]` holds `source` (the file) when one was given.
    """

    contract: str
    valid: pd.DataFrame
    quarantine: pd.DataFrame
    rows_read: int
    source: str | None = None

    @property
    def rows_valid(self) -> int:
        return len(self.valid)

    @property
    def rows_quarantined(self) -> int:
        return len(self.quarantine)

    def by_reason(self) -> dict[str, int]:
        if self.quarantine.empty:
            return {}
        counts = self.quarantine[QUARANTINE_REASON].value_counts()
        return {str(k): int(v) for k, v in counts.sort_index().items()}

    def summary(self) -> dict:
        """The counts every pipeline puts in summary.json."""
        return {
            "contract": self.contract,
            "source": self.source,
            "rows_read": self.rows_read,
            "rows_valid": self.rows_valid,
            "rows_quarantined": self.rows_quarantined,
            "quarantine_by_reason": self.by_reason(),
            **({"truncated": cut} if (cut := self.truncated()) else {}),
        }

    def truncated(self) -> list[str]:
        """'line N: <detail>' of each quarantined line cut mid-line (a JSON Lines file whose
        last line lacks its newline and does not parse); the summary's `truncated`."""
        q = self.quarantine
        if q.empty or QUARANTINE_DETAIL not in q.columns:
            return []
        cut = q[q[QUARANTINE_DETAIL].astype(str).str.startswith("truncated:")]
        rows = cut[SOURCE_ROW] if SOURCE_ROW in cut.columns else [None] * len(cut)
        return [f"{self.source or 'ledger'} line {r}: {d}"
                for r, d in zip(rows, cut[QUARANTINE_DETAIL], strict=True)]


# ---------------------------------------------------------------- coercion
# Each coercer returns (coerced series, mask of non-null values that are not of
# the kind). Fast paths for typed columns (Parquet); element checks for object
# columns (JSON Lines can hold anything).


def _is_real_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real_number(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(
        x, (bool, np.bool_)
    )


def _is_finite_number(x: object) -> bool:
    """A real number a double holds finitely (np.isfinite raises TypeError on an int
    beyond int64, such as a JSON 2**80)."""
    if not _is_real_number(x):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an int beyond a double's range
        return False


def _inferred(s: pd.Series) -> str:
    """pandas' C-level scan of an object column's element types (skipping nulls)."""
    return pd.api.types.infer_dtype(s, skipna=True) if pd.api.types.is_object_dtype(s) else ""


def _coerce_int(s: pd.Series, null: pd.Series) -> tuple[pd.Series, pd.Series]:
    if _inferred(s) == "integer":
        try:
            s = s.astype("float64") if null.any() else s.astype("int64")
        except OverflowError:  # an int beyond int64 (JSON 2**80): the element checks flag it
            pass
    if pd.api.types.is_bool_dtype(s):
        return pd.Series(pd.NA, index=s.index, dtype="Int64"), ~null
    if pd.api.types.is_unsigned_integer_dtype(s):  # uint64 (JSON 2**63, Parquet uint64)
        vals = s.to_numpy(dtype="uint64", na_value=0)
        ok = pd.Series(vals < 2**62, index=s.index)
        out = pd.Series(np.where(ok, vals, 0).astype("int64"), index=s.index).astype("Int64")
        return out.mask(~ok | null), ~ok & ~null
    if pd.api.types.is_integer_dtype(s):
        return s.astype("Int64"), pd.Series(False, index=s.index)
    if pd.api.types.is_float_dtype(s):
        vals = s.to_numpy(dtype="float64", na_value=np.nan)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(vals) & (np.floor(vals) == vals) & (np.abs(vals) < 2**62)
        bad = pd.Series(~ok, index=s.index) & ~null
        out = pd.Series(np.where(ok, vals, 0), index=s.index).astype("int64").astype("Int64")
        out[~pd.Series(ok, index=s.index)] = pd.NA
        return out, bad
    # object: integers, or integral floats (JSON readers turn 3 into 3.0 next to a null)
    def ok_elem(x: object) -> bool:
        if _is_real_int(x):
            return abs(int(x)) < 2**62
        if isinstance(x, (float, np.floating)) and not isinstance(x, (bool, np.bool_)):
            return bool(np.isfinite(x)) and float(x).is_integer() and abs(x) < 2**62
        return False

    ok = s.map(ok_elem).astype(bool) & ~null
    bad = ~ok & ~null
    out = pd.Series(pd.NA, index=s.index, dtype="Int64")
    if ok.any():
        out[ok] = s[ok].map(int).astype("int64")
    return out, bad


def _coerce_float(s: pd.Series, null: pd.Series) -> tuple[pd.Series, pd.Series]:
    if pd.api.types.is_bool_dtype(s):
        return pd.Series(np.nan, index=s.index), ~null
    if pd.api.types.is_numeric_dtype(s):
        vals = s.to_numpy(dtype="float64", na_value=np.nan)
        bad = pd.Series(~np.isfinite(vals), index=s.index) & ~null
        return pd.Series(np.where(bad, np.nan, vals), index=s.index), bad
    ok = s.map(_is_finite_number).astype(bool) & ~null
    out = pd.Series(np.nan, index=s.index, dtype="float64")
    if ok.any():
        out[ok] = s[ok].astype("float64")
    return out, ~ok & ~null


def _coerce_bool(s: pd.Series, null: pd.Series) -> tuple[pd.Series, pd.Series]:
    if pd.api.types.is_bool_dtype(s):
        return s.astype("boolean"), pd.Series(False, index=s.index)
    ok = s.map(lambda x: isinstance(x, (bool, np.bool_))).astype(bool) & ~null
    out = pd.Series(pd.NA, index=s.index, dtype="boolean")
    if ok.any():
        out[ok] = s[ok].astype(bool)
    return out, ~ok & ~null


def _coerce_str(s: pd.Series, null: pd.Series) -> tuple[pd.Series, pd.Series]:
    if (pd.api.types.is_string_dtype(s) and not pd.api.types.is_object_dtype(s)) or (
            _inferred(s) in ("string", "empty")):
        return s.astype(object).where(~null, None), pd.Series(False, index=s.index)
    # strings as they are; integers (ids written as numbers) become strings
    kind = s.map(lambda x: 1 if isinstance(x, str) else (2 if _is_real_int(x) else 0))
    ok = (kind > 0) & ~null
    out = s.astype(object).where(kind == 1, None)
    ints = (kind == 2) & ~null
    if ints.any():
        out[ints] = s[ints].map(lambda x: str(int(x)))
    out[null] = None
    return out, ~ok & ~null


def _coerce_timestamp(s: pd.Series, null: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Epoch milliseconds (int) or RFC 3339 strings -> Int64 epoch ms, UTC."""
    out = pd.Series(pd.NA, index=s.index, dtype="Int64")
    if pd.api.types.is_datetime64_any_dtype(s):
        # epoch ms from the column's own unit: not through ns, which overflows past
        # 2262 (a Parquet timestamp[ms] can hold any int64)
        ticks = s.array.asi8  # the instant in `unit` since the epoch, UTC (tz or naive)
        unit = s.dt.unit
        if unit == "s":
            fits = np.abs(ticks) < (2**63 - 1) // 1000
            ms = np.where(fits, ticks, 0) * 1000
        else:
            fits = np.ones(len(ticks), dtype=bool)
            ms = ticks // {"ms": 1, "us": 1_000, "ns": 1_000_000}[unit]
        out = pd.Series(ms, index=s.index).astype("Int64").mask(null)
        bad = pd.Series(~fits, index=s.index) & ~null
    elif pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        out, bad = _coerce_int(s, null)
    elif _inferred(s) in ("string", "empty"):
        parsed = pd.to_datetime(s, utc=True, errors="coerce", format="ISO8601")
        ok = parsed.notna()
        out[ok] = (parsed[ok].astype("datetime64[ns, UTC]").astype("int64") // 1_000_000).astype(
            "int64")
        bad = ~ok & ~null
    else:
        is_str = s.map(lambda x: isinstance(x, str)).astype(bool) & ~null
        is_num = s.map(_is_real_number).astype(bool) & ~null
        bad = ~(is_str | is_num) & ~null
        if is_num.any():
            nums, nbad = _coerce_int(s[is_num].astype(object), pd.Series(False, index=s[is_num].index))
            out[is_num] = nums
            bad = bad | nbad.reindex(s.index, fill_value=False).astype(bool)
        if is_str.any():
            parsed = pd.to_datetime(s[is_str], utc=True, errors="coerce", format="ISO8601")
            ok = parsed.notna()
            ms = parsed[ok].astype("datetime64[ns, UTC]").astype("int64") // 1_000_000
            out[ms.index] = ms.astype("int64")
            bad[ok[~ok].index] = True
    in_range = out.between(_TS_MIN_MS, _TS_MAX_MS - 1).fillna(True).astype(bool)
    bad = (bad | ~in_range) & ~null
    out = out.mask(bad)
    return out, bad


def _coerce_list(s: pd.Series, null: pd.Series) -> tuple[pd.Series, pd.Series]:
    ok = s.map(lambda x: isinstance(x, (list, tuple, np.ndarray))).astype(bool) & ~null
    return s.where(ok, None), ~ok & ~null


_COERCERS = {
    "int": _coerce_int,
    "float": _coerce_float,
    "bool": _coerce_bool,
    "str": _coerce_str,
    "enum": _coerce_str,
    "timestamp": _coerce_timestamp,
    "list": _coerce_list,
}


def _null_mask(s: pd.Series) -> pd.Series:
    # isna() is elementwise on object columns too: a list or array cell is not null
    return s.isna()


# ---------------------------------------------------------------- validation


def validate_frame(raw: pd.DataFrame, schema: Schema, source: str | None = None,
                   pre_quarantined: pd.DataFrame | None = None) -> ValidationResult:
    """Split `raw` into valid rows and a quarantine, by the rules of `schema`.

    `pre_quarantined` holds rows a reader could not even parse (e.g. a JSON
    Lines line that is not JSON); they are counted as read and quarantined.
    Raises ContractError for file-level problems only.
    """
    where = source or "<frame>"
    raw = raw.reset_index(drop=True)
    if SOURCE_ROW not in raw.columns:
        raw = raw.assign(**{SOURCE_ROW: np.arange(len(raw), dtype="int64")})
    n_pre = 0 if pre_quarantined is None else len(pre_quarantined)
    if len(raw) == 0 and n_pre == 0:
        raise ContractError(f"{where}: no rows (empty file or frame)")
    if len(raw) > 0:
        missing = [c for c in schema.required_columns if c not in raw.columns]
        if missing:
            raise ContractError(f"{where}: missing required column(s) {', '.join(missing)} "
                                f"for {schema.name}")
    forbidden = [c for c in schema.forbidden_columns if c in raw.columns]
    if forbidden:
        raise ContractError(f"{where}: column(s) {', '.join(forbidden)} are not allowed in "
                            f"{schema.name} (no content or identifiers)")

    reason = pd.Series(None, index=raw.index, dtype=object)
    detail = pd.Series(None, index=raw.index, dtype=object)

    assigned = np.zeros(len(raw), dtype=bool)  # rows that already carry a reason

    def flag(mask: pd.Series, code: str, why: str) -> None:
        m = mask.fillna(False).to_numpy(dtype=bool) & ~assigned
        if m.any():
            reason[m] = code
            detail[m] = why
            assigned[m] = True

    coerced: dict[str, pd.Series] = {}
    if len(raw) > 0:
        # version first: a file of another version is a file-level error
        vcol = raw[schema.version_column]
        vnull = _null_mask(vcol)
        vstr, _ = _coerce_str(vcol, vnull)
        known = vstr.isin(schema.supported_versions)
        seen = set(vstr[~vnull].dropna().unique().tolist())
        if seen and not (seen & set(schema.supported_versions)):
            shown = ", ".join(sorted(map(str, seen))[:3])
            raise ContractError(f"{where}: {schema.version_column} {shown} is not supported "
                                f"(this code reads {', '.join(schema.supported_versions)})")
        flag(~known, f"unknown_{schema.version_column}",
             f"{schema.version_column} not in {schema.supported_versions}")

        for f in schema.fields:
            if f.name not in raw.columns:
                continue
            s = raw[f.name]
            null = _null_mask(s)
            if not f.nullable:
                flag(null, "missing_required_field", f.name)
            out, bad = _COERCERS[f.kind](s, null)
            flag(bad, "bad_timestamp" if f.kind == "timestamp" else "bad_type", f.name)
            if f.kind == "enum":
                flag(~null & ~out.isin(f.values), "unknown_enum_value", f"{f.name}={{value}}")
            if f.min is not None:
                below = out <= f.min if f.min_exclusive else out < f.min
                flag(below, f.below_min_reason, f.name)
            if f.max is not None:
                flag(out > f.max, "out_of_range", f.name)
            coerced[f.name] = out

        ok = pd.Series(~assigned, index=raw.index)
        frame = raw.copy()
        for name, s in coerced.items():
            frame[name] = s
        frame[schema.version_column] = vstr
        for rule in schema.row_rules:
            m, code, why = rule(frame[ok])
            flag(m.reindex(raw.index, fill_value=False), code, why)
            ok = pd.Series(~assigned, index=raw.index)
        if schema.unique_key and all(k in frame.columns for k in schema.unique_key):
            dup = frame[ok].duplicated(list(schema.unique_key), keep="first")
            flag(dup.reindex(raw.index, fill_value=False), schema.duplicate_reason,
                 "+".join(schema.unique_key))
        ok = pd.Series(~assigned, index=raw.index)
        valid = frame[ok].drop(columns=[SOURCE_ROW]).reset_index(drop=True)
        for f in schema.fields:  # non-nullable numbers need no mask once nulls are out
            if not f.nullable and f.kind in ("int", "timestamp") and f.name in valid.columns:
                valid[f.name] = valid[f.name].astype("int64")
    else:
        ok = pd.Series(dtype=bool)
        valid = raw.drop(columns=[SOURCE_ROW], errors="ignore")

    quarantine = raw[~ok].copy() if len(raw) else raw.iloc[0:0].copy()
    if len(quarantine):
        # enum details name the offending value
        d = detail[~ok].copy()
        enum_rows = reason[~ok] == "unknown_enum_value"
        for idx in d[enum_rows].index:
            col = d[idx].split("=")[0]
            d[idx] = f"{col}={raw.at[idx, col]!r}"[:200]
        quarantine[QUARANTINE_REASON] = reason[~ok].values
        quarantine[QUARANTINE_DETAIL] = d.values
    else:
        quarantine[QUARANTINE_REASON] = pd.Series(dtype=object)
        quarantine[QUARANTINE_DETAIL] = pd.Series(dtype=object)
    if pre_quarantined is not None and len(pre_quarantined):
        quarantine = pd.concat([pre_quarantined, quarantine], ignore_index=True, sort=False)
    quarantine = quarantine.reset_index(drop=True)
    if source is not None:
        valid.attrs[SOURCE_ATTR] = source
    return ValidationResult(contract=schema.name, valid=valid, quarantine=quarantine,
                            rows_read=len(raw) + n_pre, source=source)
