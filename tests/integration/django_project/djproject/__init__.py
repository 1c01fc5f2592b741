"""A real Django project that uses ultimat3 the way its README says, for tests/integration/test_django.py."""
