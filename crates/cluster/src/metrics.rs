//! `/metrics` and `/health`.
