"""The driver contract suite: every test here runs against every driver."""
