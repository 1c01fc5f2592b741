"""Management commands of the Django integration."""
