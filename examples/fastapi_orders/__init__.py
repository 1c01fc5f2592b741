"""A FastAPI app that writes an order and enqueues its confirmation in ONE async transaction."""
