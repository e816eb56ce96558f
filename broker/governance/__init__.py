"""Approval-gated writes and their review (docs/governance.md), and the sweepers that expire
entries, close proposals and drop old audit records."""
