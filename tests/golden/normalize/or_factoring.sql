-- Each case: the query, then what the rule makes of it; cases apart by a blank line.
-- TPC-H query 19's shape: the join key in every branch.
SELECT SUM(l_extendedprice) FROM lineitem, part WHERE (p_partkey = l_partkey AND p_brand = 'Brand#12' AND l_quantity >= 1) OR (p_partkey = l_partkey AND p_brand = 'Brand#23') OR (p_partkey = l_partkey AND p_brand = 'Brand#34' AND l_quantity <= 30)
SELECT SUM(l_extendedprice) FROM lineitem, part WHERE p_partkey = l_partkey AND ((p_brand = 'Brand#12' AND l_quantity >= 1) OR p_brand = 'Brand#23' OR (p_brand = 'Brand#34' AND l_quantity <= 30))

-- Absorption: a branch that is the common part alone.
SELECT COUNT(*) FROM t WHERE x = 1 OR (x = 1 AND y = 2)
SELECT COUNT(*) FROM t WHERE x = 1

-- Inside NOT, parenthesised.
SELECT COUNT(*) FROM t WHERE NOT ((x = 1 AND y = 2) OR (x = 1 AND z = 3))
SELECT COUNT(*) FROM t WHERE NOT (x = 1 AND (y = 2 OR z = 3))

-- Two common conjuncts, in a JOIN's ON.
SELECT COUNT(*) FROM a JOIN b ON (a.k = b.k AND a.j = b.j AND a.x = 1) OR (a.j = b.j AND a.k = b.k AND b.y = 2)
SELECT COUNT(*) FROM a JOIN b ON a.k = b.k AND a.j = b.j AND (a.x = 1 OR b.y = 2)

-- Nothing in common: unchanged.
SELECT COUNT(*) FROM t WHERE (x = 1 AND y = 2) OR (x = 2 AND y = 1)
SELECT COUNT(*) FROM t WHERE (x = 1 AND y = 2) OR (x = 2 AND y = 1)

-- The same condition written the other way round is another conjunct.
SELECT COUNT(*) FROM a, b WHERE (a.k = b.k AND a.x = 1) OR (b.k = a.k AND a.x = 2)
SELECT COUNT(*) FROM a, b WHERE (a.k = b.k AND a.x = 1) OR (b.k = a.k AND a.x = 2)
