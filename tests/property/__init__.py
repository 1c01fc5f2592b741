"""Property-based tests (hypothesis): bad input either works or fails coded, never half-written."""
