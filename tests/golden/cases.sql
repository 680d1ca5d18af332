-- The golden cases: each a policy, an ε and a query (one line each), pinned with the
-- plan summary the dry run shows and the SQL the gate generates in expected/NAME.txt.
-- Regenerate deliberately with `python -m tests.golden.run --update` and review the diff.

-- count: clinic 1.0
SELECT COUNT(*) AS n FROM visits
-- count_by_public_key: clinic 1.0
SELECT department, COUNT(*) AS n FROM visits GROUP BY department
-- two_keys_integer_range: clinic 1.0
SELECT year, stay_days, COUNT(*) AS n FROM visits GROUP BY year, stay_days
-- sum_where: clinic 0.5
SELECT SUM(stay_days) AS days FROM visits WHERE cost > 1000 AND department = 'oncology'
-- sum_of_expression: clinic 0.5
SELECT SUM(cost * 2 + stay_days) AS s FROM visits
-- avg_grouped: clinic 1.0
SELECT department, AVG(cost) AS mean_cost FROM visits GROUP BY department
-- variance_stddev: clinic 1.0
SELECT VARIANCE(stay_days) AS v, STDDEV(cost) AS sd FROM visits
-- median_and_quantile: clinic 1.0
SELECT MEDIAN(cost) AS med, QUANTILE_CONT(stay_days, 0.9) AS p90 FROM visits
-- count_distinct_unit: clinic 1.0
SELECT COUNT(DISTINCT patient_id) AS patients FROM visits
-- count_distinct_value: clinic 1.0
SELECT COUNT(DISTINCT department) AS departments FROM visits
-- join_private_private: clinic 1.0
SELECT p.sex, COUNT(*) AS n, AVG(v.cost) AS c FROM patients p JOIN visits v ON v.patient_id = p.patient_id GROUP BY p.sex
-- join_public: clinic 1.0
SELECT r.region, COUNT(*) AS n FROM patients p JOIN regions r ON r.state = p.state GROUP BY r.region
-- semi_join: clinic 1.0
SELECT COUNT(*) AS n FROM patients WHERE patient_id IN (SELECT patient_id FROM visits WHERE department = 'cardiology')
-- exists: clinic 1.0
SELECT COUNT(*) AS n FROM patients p WHERE EXISTS (SELECT 1 FROM visits v WHERE v.patient_id = p.patient_id AND v.stay_days > 3)
-- having_order_limit: clinic 1.0
SELECT department, COUNT(*) AS n FROM visits GROUP BY department HAVING COUNT(*) > 10 ORDER BY n DESC LIMIT 2
-- arithmetic_over_aggregates: clinic 1.0
SELECT SUM(cost) / COUNT(*) AS ratio, COUNT(*) - 1 AS less FROM visits
-- filter_clause: clinic 1.0
SELECT COUNT(*) FILTER (WHERE stay_days > 0) AS inpatient, COUNT(*) AS all_visits FROM visits
-- case_and_text: clinic 1.0
SELECT COUNT(*) AS n FROM visits WHERE CASE WHEN UPPER(note) LIKE 'A%' THEN stay_days * 2 ELSE 0 END > 4
-- dates: clinic 1.0
SELECT YEAR(seen) AS y, COUNT(*) AS n FROM visits WHERE seen >= DATE '2020-01-01' GROUP BY YEAR(seen)
-- randomized_response: clinic 1.0
SELECT smoker, COUNT(*) AS n FROM patients GROUP BY smoker
-- randomized_response_mean: clinic 1.0
SELECT AVG(smoker) AS rate FROM patients
-- private_keys: clinic_approx 1.0
SELECT note, COUNT(*) AS n FROM visits GROUP BY note
-- gaussian_sum: clinic_zcdp 1.0
SELECT department, SUM(stay_days) AS d FROM visits GROUP BY department
-- gaussian_join_window: clinic_zcdp 1.0
SELECT p.sex, COUNT(*) AS n FROM patients p JOIN visits v ON v.patient_id = p.patient_id GROUP BY p.sex
-- row_level: rows 1.0
SELECT region, COUNT(*) AS n, AVG(income) AS mean_income FROM answers GROUP BY region
-- row_level_quantile: rows 1.0
SELECT MEDIAN(age) AS med FROM answers
-- date_interval_window: clinic 1.0
SELECT COUNT(*) AS n, SUM(cost) AS c FROM visits WHERE seen >= DATE '2020-01-31' + INTERVAL '1' MONTH AND seen < DATE '2021-01-01' - INTERVAL '68 days'
-- extract_year_key: clinic 1.0
SELECT EXTRACT(YEAR FROM seen) AS y, COUNT(*) AS n FROM visits WHERE seen < DATE '2020-01-01' + INTERVAL 2 YEAR GROUP BY EXTRACT(YEAR FROM seen)
-- column_list_after_alias: clinic 1.0
SELECT SUM(c) AS total FROM (SELECT department, cost FROM visits) AS v (d, c) WHERE d = 'oncology'
-- or_factored: clinic 1.0
SELECT COUNT(*) AS n FROM visits WHERE (department = 'oncology' AND stay_days > 3) OR (department = 'oncology' AND cost > 500)
