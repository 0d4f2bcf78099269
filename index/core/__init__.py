"""What every index kind shares: the base class and its contract, ids and stored rows, locking, the
search paths' plumbing, filters, range search, the index file and mapped files."""
