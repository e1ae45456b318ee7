"""Calibration: fit step-cost profiles to what real engines do.

    measurements.py  the measured step-times file (CSV or Parquet): schema and checks
    features.py      measured rows -> the cost model's step features (P, A, N, D, C)
    fit.py           the vectorised cost model and the robust, bounded fit
    fit_error.py     the one error figure of a profile on measured steps, and its rows
    profile.py       the --like profile in, the calibrated profile (with provenance) out
    measured.py      ``calibrate measurements`` and ``profile check`` as library calls
    observed.py      ``calibrate observed``: scale a profile until replayed production
                     traffic matches the TTFT and TPOT the logs observed
    synthetic.py     generated measurements for tests and benchmarks
    holdout.py       a fit's error on rows it did not see: measured tables split per
                     model, GPU and TP degree, and a plain least-squares yardstick

docs/calibration.md is the user guide.
"""

import os

# NOTE: the fit's linear algebra works on tall matrices of 11 columns, where BLAS threads
# only wait on each other: 10-20x slower on a busy machine (4 s instead of 0.2 s for 10k
# rows). One thread, unless the user chose otherwise; this takes effect when the package
# is imported before numpy, as the `tracereplay calibrate` and `profile check` commands do.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
