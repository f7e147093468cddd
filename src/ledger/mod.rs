//! Per-example RDP ledgers and the step protocol (spec §3).
