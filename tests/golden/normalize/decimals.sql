-- Each case: the query, then what the rule makes of it; cases apart by a blank line.
-- TPC-H query 6's window: exact, as SQL's DECIMAL computes it.
SELECT SUM(l_extendedprice * l_discount) FROM lineitem WHERE l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01
SELECT SUM(l_extendedprice * l_discount) FROM lineitem WHERE l_discount BETWEEN 0.05 AND 0.07

-- A chain folds whole, innermost first; a negative result stays a number.
SELECT COUNT(*) FROM t WHERE x > 0.1 + 0.2 * 3 - 1
SELECT COUNT(*) FROM t WHERE x > (-0.3)

-- Integers alone, a column, and exponents are left as written.
SELECT COUNT(*) FROM t WHERE x > 1 + 10 AND y < x + 0.5 AND z > 1e2 + 0.5
SELECT COUNT(*) FROM t WHERE x > 1 + 10 AND y < x + 0.5 AND z > 1e2 + 0.5
