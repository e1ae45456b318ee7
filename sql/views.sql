-- Views over the tracereplay warehouse: one per table, named like the table.
-- Reads:   every table directory of the warehouse (hive-partitioned Parquet)
-- Params:  none. Paths are relative to the warehouse directory, so either run
--          the duckdb shell from inside it:
--              cd warehouse && duckdb -cmd ".read ../sql/views.sql"
--          or, from anywhere:  SET file_search_path = '/path/to/warehouse';
--          then paste this file. Each table holds a zero-row _empty.parquet,
--          so every view resolves (with its column types) before data lands.
-- Runs appear whole or not at all: a run's files land first and its runs row
-- last, so the sim_*, scenarios and capacity_search views show only runs
-- with a runs row that did not fail; files of a run that is still going, or
-- was killed, stay out of sight (the next writing command removes them).
CREATE OR REPLACE VIEW requests AS
SELECT * FROM read_parquet('requests/*/*.parquet',
    hive_partitioning = true, hive_types = {'date': DATE}, union_by_name = true);

CREATE OR REPLACE VIEW quarantine AS
SELECT * FROM read_parquet('quarantine/*.parquet', union_by_name = true);

CREATE OR REPLACE VIEW runs AS
SELECT * FROM read_parquet('runs/*.parquet', union_by_name = true);

CREATE OR REPLACE VIEW sim_requests AS
SELECT * FROM read_parquet('sim_requests/*/*.parquet',
    hive_partitioning = true, hive_types = {'run_id': VARCHAR}, union_by_name = true)
WHERE run_id <> '_empty'
    AND run_id IN (SELECT run_id FROM runs WHERE status <> 'failed');

CREATE OR REPLACE VIEW sim_steps AS
SELECT * FROM read_parquet('sim_steps/*/*.parquet',
    hive_partitioning = true, hive_types = {'run_id': VARCHAR}, union_by_name = true)
WHERE run_id <> '_empty'
    AND run_id IN (SELECT run_id FROM runs WHERE status <> 'failed');

CREATE OR REPLACE VIEW scenarios AS
SELECT * FROM read_parquet('scenarios/*/*.parquet',
    hive_partitioning = true, hive_types = {'run_id': VARCHAR}, union_by_name = true)
WHERE run_id <> '_empty'
    AND run_id IN (SELECT run_id FROM runs WHERE status <> 'failed');

CREATE OR REPLACE VIEW capacity_search AS
SELECT * FROM read_parquet('capacity_search/*/*.parquet',
    hive_partitioning = true, hive_types = {'run_id': VARCHAR}, union_by_name = true)
WHERE run_id <> '_empty'
    AND run_id IN (SELECT run_id FROM runs WHERE status <> 'failed');

CREATE OR REPLACE VIEW calibration AS
SELECT * FROM read_parquet('calibration/*/*.parquet',
    hive_partitioning = true, hive_types = {'run_id': VARCHAR}, union_by_name = true)
WHERE run_id <> '_empty';

CREATE OR REPLACE VIEW live_requests AS
SELECT * FROM read_parquet('live_requests/*/*.parquet',
    hive_partitioning = true, hive_types = {'run_id': VARCHAR}, union_by_name = true)
WHERE run_id <> '_empty'
    AND run_id IN (SELECT run_id FROM runs WHERE status <> 'failed');

CREATE OR REPLACE VIEW live_metrics AS
SELECT * FROM read_parquet('live_metrics/*/*.parquet',
    hive_partitioning = true, hive_types = {'run_id': VARCHAR}, union_by_name = true)
WHERE run_id <> '_empty'
    AND run_id IN (SELECT run_id FROM runs WHERE status <> 'failed');

CREATE OR REPLACE VIEW validation AS
SELECT * FROM read_parquet('validation/*/*.parquet',
    hive_partitioning = true, hive_types = {'run_id': VARCHAR}, union_by_name = true)
WHERE run_id <> '_empty';

CREATE OR REPLACE VIEW validation_requests AS
SELECT * FROM read_parquet('validation_requests/*/*.parquet',
    hive_partitioning = true, hive_types = {'run_id': VARCHAR}, union_by_name = true)
WHERE run_id <> '_empty';
