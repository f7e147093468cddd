//! Durable event log (issue 4).
