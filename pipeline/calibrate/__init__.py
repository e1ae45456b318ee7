"""Calibration: fit step-cost profiles to what real engines do.

    measurements.py  the measured step-times file (CSV or Parquet): schema and checks
    features.py      measured rows -> the cost model's step features (P, A, N, D, C)
    fit.py           the vectorised cost model and the robust, bounded fit
    profile.py       the --like profile in, the calibrated profile (with provenance) out
    measured.py      ``calibrate measurements`` and ``profile check`` as library calls
    observed.py      ``calibrate observed``: scale a profile until replayed production
                     traffic matches the TTFT and TPOT the logs observed
    synthetic.py     generated measurements for tests and benchmarks

docs/calibration.md is the user guide.
"""
