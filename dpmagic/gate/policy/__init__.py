"""The data owner's policy: which tables exist, what is public, the bounds.

The policy file is the only source of facts the analysis passes may use. One job
per module: ``values`` holds the typed values every pass reads, ``schema`` the
file's shape (msgspec models: keys, types, ranges), ``parsing`` the rules that link
keys and build the values, ``loading`` the file's reading. Every name is imported
from here.
"""

from dpmagic.gate.policy.loading import load_policy
from dpmagic.gate.policy.parsing import check_workers, parse_policy
from dpmagic.gate.policy.values import (
    ACCOUNTANTS,
    CATALOG_PREFIX,
    COLUMN_TYPES,
    DEFAULT_MAX_LENGTH,
    DEFAULT_MAX_RESOURCE_FAILURES,
    DEFAULT_MAX_UNIT_WORK,
    DEFAULT_QUANTUM_MS,
    DERIVED_UNIT,
    ENGINES,
    MAX_MAX_LENGTH,
    MAX_UNIT_ROWS,
    NEIGHBOURING,
    AccountantKind,
    Budget,
    Column,
    ColumnType,
    Dataset,
    EngineKind,
    GateConfig,
    Neighbouring,
    Policy,
    PolicyError,
    RandomizedResponse,
    SparkConfig,
    Table,
    Via,
)

__all__ = [
    "ACCOUNTANTS",
    "CATALOG_PREFIX",
    "COLUMN_TYPES",
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_MAX_RESOURCE_FAILURES",
    "DEFAULT_MAX_UNIT_WORK",
    "DEFAULT_QUANTUM_MS",
    "DERIVED_UNIT",
    "ENGINES",
    "MAX_MAX_LENGTH",
    "MAX_UNIT_ROWS",
    "NEIGHBOURING",
    "AccountantKind",
    "Budget",
    "Column",
    "ColumnType",
    "Dataset",
    "EngineKind",
    "GateConfig",
    "Neighbouring",
    "Policy",
    "PolicyError",
    "RandomizedResponse",
    "SparkConfig",
    "Table",
    "Via",
    "check_workers",
    "load_policy",
    "parse_policy",
]
