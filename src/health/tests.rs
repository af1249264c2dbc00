//! Unit tests of the evaluation over time: successive snapshots at chosen instants, no sleeping.
