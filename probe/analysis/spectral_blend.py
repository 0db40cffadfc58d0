"""Blends of two filter classes (probe/analysis/spectral.py): does a layer's response read as
r = g (w r_A + (1 - w) r_B), one member of class A and one of class B, better than any one class?

Per predictor, every pair of members from two different classes (least squares left out: its
r = 1 would fit any offset) is fitted with non-negative coefficients by least squares over the
kept bins, c_A r_A + c_B r_B, and the pair with the smallest relative error kept; w = c_A / (c_A +
c_B). On each bootstrap resample the same pair is refitted (w and the error), and the single-class
fits are the resample's own class minima (refitted over every member, which favours them). A layer
reads "mixed" when on 95% of resamples the blend removes over half the best single class's error
(`MIN_SHARE`; the blend has two more free parameters, so on a pure filter plus noise it always
removes some: about 20% over a dozen bins) and w's 90% interval lies inside [0.1, 0.9] (`MIN_W`): a
pure filter refits to w = 0 or 1 (one coefficient at 0) on a share of resamples, and a filter
between two grid values of one family is fitted by its nearest member plus a few percent of another
class (ridge with a penalty between the grid's: w 0.03), which is not a mixture. "Mixed" therefore
says: better fitted by two classes, each carrying at least a tenth, than by one member of any class;
two members of one class (as many parameters) fit noisy planted blends about as well, so it does
not identify a mixture. Where one class already fits the response to round-off (`EXACT_FIT`: a
planted filter), there is no blend: no error is left for one to remove, and which pair fits best is
a tie that round-off breaks (two hosts named different pairs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .spectral_references import Members

BLENDED = ("gd", "precond_gd", "ridge")  # the classes a blend is made of
MIN_SHARE = 0.5  # of the best single class's error a blend must remove on 95% of resamples
MIN_W = 0.1  # the smaller class's weight in a blend called mixed (w's interval inside [MIN_W, 1 - MIN_W])
EXACT_FIT = 1e-12  # a relative error at which one class fits to round-off (planted filters: about 1e-16)
NO_BLEND = (-1, -1, -1, -1, math.inf)


@dataclass
class Blend:
    """Per predictor (A,): the two classes (indices into `Members.classes`), their members, the
    weight w on the first, the relative error, and over resamples w's 5-95% interval and the 5%
    quantile of the share of the best single class's error the blend removes (`gain_low`); `mixed`
    where that is above MIN_SHARE and w's interval excludes 0 and 1."""

    first: list[int]
    second: list[int]
    member_first: list[int]
    member_second: list[int]
    w: Tensor
    error: Tensor
    w_low: Tensor
    w_high: Tensor
    gain_low: Tensor
    mixed: Tensor


def pair_fit(x: Tensor, ra: Tensor, rb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Non-negative least squares of x on (ra, rb) over the last axis, broadcast over the others:
    (c_a, c_b, relative error sum((x - c_a ra - c_b rb)^2) / sum(x^2)). Where the unconstrained fit
    has a negative coefficient, the better single non-negative fit (the other coefficient 0)."""
    gaa, gbb, gab = (ra * ra).sum(-1), (rb * rb).sum(-1), (ra * rb).sum(-1)
    xa, xb, xx = (x * ra).sum(-1), (x * rb).sum(-1), (x * x).sum(-1)
    det = gaa * gbb - gab**2
    ok = det > 1e-12 * gaa * gbb
    ca = torch.where(ok, (gbb * xa - gab * xb) / det.clamp_min(1e-300), torch.zeros_like(det))
    cb = torch.where(ok, (gaa * xb - gab * xa) / det.clamp_min(1e-300), torch.zeros_like(det))
    both = ok & (ca > 0) & (cb > 0)
    sa, sb = (xa / gaa.clamp_min(1e-300)).clamp_min(0), (xb / gbb.clamp_min(1e-300)).clamp_min(0)
    a_only = xx - 2 * sa * xa + sa**2 * gaa
    b_only = xx - 2 * sb * xb + sb**2 * gbb
    take_a = a_only <= b_only
    ca = torch.where(both, ca, torch.where(take_a, sa, torch.zeros_like(sa)))
    cb = torch.where(both, cb, torch.where(take_a, torch.zeros_like(sb), sb))
    left = xx - 2 * ca * xa - 2 * cb * xb + ca**2 * gaa + cb**2 * gbb + 2 * ca * cb * gab
    return ca, cb, left.clamp_min(0) / xx.clamp_min(1e-300)  # a sum of squares: below 0 only by round-off


def best_blend(r: Tensor, r_ref: Tensor, members: Members) -> list[tuple[int, int, int, int, float]]:
    """Per predictor r (A, K) the best pair over members r_ref (M, K) of two different BLENDED
    classes: (class a, class b, member i, member j, relative error)."""
    out: list[tuple[int, int, int, int, float]] = [NO_BLEND] * r.shape[0]
    classes = [c for c, name in enumerate(members.classes) if name in BLENDED]
    for n, ca in enumerate(classes):
        for cb in classes[n + 1 :]:
            i = torch.nonzero(members.class_index == ca).flatten()
            j = torch.nonzero(members.class_index == cb).flatten()
            if not len(i) or not len(j):
                continue
            _, _, err = pair_fit(r[:, None, None, :], r_ref[i][None, :, None, :], r_ref[j][None, None, :, :])
            flat = torch.nan_to_num(err, nan=math.inf).flatten(1)  # (A, |i| |j|)
            e, at = flat.min(-1)
            for a in range(r.shape[0]):
                if float(e[a]) < out[a][4]:
                    out[a] = (ca, cb, int(i[int(at[a]) // len(j)]), int(j[int(at[a]) % len(j)]), float(e[a]))
    return out


def blend_fits(
    r: Tensor,
    r_ref: Tensor,
    r_boot: Tensor,
    r_ref_boot: Tensor,
    single: Tensor,
    single_boot: Tensor,
    members: Members,
) -> Blend:
    """The best blend per predictor and its resampled intervals: r (A, K), r_ref (M, K), their
    resamples (S, A, K), (S, M, K), over the kept bins; single (A,) and single_boot (S, A) the best
    single-class error on the sample and on each resample. None (classes -1, NaN) where one class
    fits to `EXACT_FIT`; a resample where one does has no share of error removed (NaN)."""
    best = [b if float(single[a]) > EXACT_FIT else NO_BLEND for a, b in enumerate(best_blend(r, r_ref, members))]
    n_a = r.shape[0]
    w, error = torch.full((n_a,), math.nan, dtype=r.dtype), torch.full((n_a,), math.nan, dtype=r.dtype)
    w_lo, w_hi, gain_lo = w.clone(), w.clone(), w.clone()
    for a, (_, _, i, j, e) in enumerate(best):
        if i < 0:
            continue
        ca, cb, _ = pair_fit(r[a], r_ref[i], r_ref[j])
        w[a], error[a] = ca / (ca + cb).clamp_min(1e-300), e
        ca_b, cb_b, err_b = pair_fit(r_boot[:, a], r_ref_boot[:, i], r_ref_boot[:, j])
        w_b = ca_b / (ca_b + cb_b).clamp_min(1e-300)
        qs = torch.tensor([0.05, 0.95], dtype=r.dtype)
        w_lo[a], w_hi[a] = torch.nanquantile(w_b, qs)
        left = single_boot[:, a]
        share = torch.where(left > EXACT_FIT, (left - err_b) / left.clamp_min(EXACT_FIT), math.nan)  # error removed
        gain_lo[a] = torch.nanquantile(share, qs)[0]
    mixed = (gain_lo > MIN_SHARE) & (w_lo > MIN_W) & (w_hi < 1 - MIN_W)
    return Blend(
        [b[0] for b in best],
        [b[1] for b in best],
        [b[2] for b in best],
        [b[3] for b in best],
        w,
        error,
        w_lo,
        w_hi,
        gain_lo,
        mixed,
    )
