//! The ex-post per-example bound (spec §10): placeholder, filled in by the
//! ex-post work (see the helper branch).
