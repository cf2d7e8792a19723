"""The ledger's schema revisions, oldest first (`rNNNN_<what>.py`)."""
