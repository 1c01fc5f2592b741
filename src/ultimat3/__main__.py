"""``python -m ultimat3`` is the ``x`` CLI."""

from ultimat3.cli import main

main()
