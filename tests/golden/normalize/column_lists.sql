-- Each case: the query, then what the rule makes of it; cases apart by a blank line.
-- TPC-H query 13's alias with its columns.
SELECT c_count, COUNT(*) AS custdist FROM (SELECT c_custkey, COUNT(o_orderkey) FROM customer GROUP BY c_custkey) AS c_orders (c_custkey, c_count) GROUP BY c_count
SELECT c_count, COUNT(*) AS custdist FROM (SELECT c_custkey, COUNT(o_orderkey) AS c_count FROM customer GROUP BY c_custkey) AS c_orders GROUP BY c_count

-- TPC-H query 15's CTE with its columns: an alias written inside is replaced.
WITH revenue0 (supplier_no, total_revenue) AS (SELECT l_suppkey, SUM(l_extendedprice) AS r FROM lineitem GROUP BY l_suppkey) SELECT MAX(total_revenue) FROM revenue0
WITH revenue0 AS (SELECT l_suppkey AS supplier_no, SUM(l_extendedprice) AS total_revenue FROM lineitem GROUP BY l_suppkey) SELECT MAX(total_revenue) FROM revenue0

-- Fewer names than columns rename the first ones.
SELECT COUNT(*) FROM (SELECT a, b, c FROM t) AS x (p) WHERE p > 1
SELECT COUNT(*) FROM (SELECT a AS p, b, c FROM t) AS x WHERE p > 1

-- A SELECT * has columns the text does not count: left for the resolver.
SELECT COUNT(*) FROM (SELECT * FROM t) AS x (p)
SELECT COUNT(*) FROM (SELECT * FROM t) AS x(p)
