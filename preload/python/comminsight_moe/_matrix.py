"""DeepXTrace's detector (`Diagnose.diagnose_matrix`) in numpy, for callers that use it directly.

The analysis of the windows a reporter writes runs in the agent (`comminsight-agent moe`, the
`ascend` crate); this is the same arithmetic (../shared/research/deepxtrace-spec.md §1.5): every
score is a ratio to a plain mean over all N or N² cells, diagonal and zeros included, flags use a
strict `>`, points in a flagged row or column are dropped, and `excluding_zeros` changes only the
point baseline (the mean of the non-zero cells; 0 when there are none).
"""

EPS = 1e-8


def diagnose_matrix(mat, thres_col=3.0, thres_row=3.0, thres_point=5.0,
                    suppress_points_in_strong_rowscols=True, excluding_zeros=0):
    """`{"abnormal_cols": [[j, col_mean, z]], "abnormal_rows": [[i, row_mean, z]],
    "abnormal_points": [[i, j, M_ij, z]]}` of the N x N matrix `mat` (row = the waiting rank,
    column = the awaited peer), indices ascending, points row-major. Needs numpy."""
    import numpy as np

    raw = np.asarray(mat)
    m = raw.astype(np.float64)
    col_means = m.mean(axis=0)
    row_means = m.mean(axis=1)
    z_col = col_means / (col_means.mean() + EPS)
    z_row = row_means / (row_means.mean() + EPS)
    if excluding_zeros:
        nz = m[m != 0]
        base = nz.mean() if nz.size else 0.0
    else:
        base = m.mean()
    z_pt = m / (base + EPS)
    cols = [int(j) for j in np.where(z_col > thres_col)[0]]
    rows = [int(i) for i in np.where(z_row > thres_row)[0]]
    points = [(int(i), int(j)) for i, j in np.argwhere(z_pt > thres_point)]
    if suppress_points_in_strong_rowscols:
        rs, cs = set(rows), set(cols)
        points = [(i, j) for i, j in points if i not in rs and j not in cs]
    return {
        "abnormal_cols": [[j, float(col_means[j]), float(z_col[j])] for j in cols],
        "abnormal_rows": [[i, float(row_means[i]), float(z_row[i])] for i in rows],
        "abnormal_points": [[i, j, raw[i, j].item(), float(z_pt[i, j])] for i, j in points],
    }
