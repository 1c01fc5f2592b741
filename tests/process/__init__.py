"""Tests that start real worker processes (``@pytest.mark.process``)."""
